"""Plug-ins reach every process: a toy engine and a toy fork model, each one module plus one
registration (tests/plugin_fixtures/), named by `SPECGEN_PLUGINS` or an entry point, and used by a
job whose reasoner the scheduler of a real LocalCluster starts."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.optimize.engine_kinds import ENGINES, engine_spec
from specgen.optimize.fork_models import FORK_MODELS, fork_writer
from specgen.runtime import plugins
from specgen.runtime.plugins import ENTRY_POINT_GROUP, PLUGINS_ENV, PluginError, load_plugins, loaded_plugins

FIXTURES = Path(__file__).resolve().parents[1] / "plugin_fixtures"
TOY_PLUGINS = "specgen_toy_engine, specgen_toy_fork_model:register"


@pytest.fixture
def clean_plugins(monkeypatch: pytest.MonkeyPatch):
    """This process as if it had loaded no plug-in; what a test registers is gone after it."""
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    engines, fork_models, modules = dict(ENGINES), dict(FORK_MODELS), set(sys.modules)
    yield monkeypatch
    for registry, before in ((ENGINES, engines), (FORK_MODELS, fork_models)):
        for name in set(registry) - set(before):
            del registry[name]
    for name in set(sys.modules) - modules:
        if name.startswith(("specgen_toy_", "toy_dist_")):
            del sys.modules[name]


@pytest.fixture
def toy_path(clean_plugins: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The fixtures' folder on the Python path, here and in every process started from here (as a
    plug-in that is a module rather than an installed package would be)."""
    clean_plugins.syspath_prepend(str(FIXTURES))
    clean_plugins.setenv("PYTHONPATH", str(FIXTURES))
    return clean_plugins


def test_the_setting_names_modules_and_functions_each_loaded_once(toy_path: pytest.MonkeyPatch) -> None:
    assert load_plugins() == [] and "toy" not in ENGINES
    with pytest.raises(UsageError, match="got 'toy' \\(plug-ins loaded in this process: none; "
                                         "a plug-in reaches every process through \\$SPECGEN_PLUGINS"):
        engine_spec({"llm": "toy"})
    toy_path.setenv(PLUGINS_ENV, TOY_PLUGINS)
    assert load_plugins() == ["specgen_toy_engine", "specgen_toy_fork_model:register"]
    assert load_plugins() == loaded_plugins() == ["specgen_toy_engine", "specgen_toy_fork_model:register"]
    assert engine_spec({"llm": "toy"}).fork_model == "toy-fork"
    assert fork_writer("toy-fork").name == "toy-fork"    # registered once: a second call would raise


def test_a_plugin_that_does_not_load_is_an_error_naming_it(toy_path: pytest.MonkeyPatch) -> None:
    for setting, expected in [
        ("specgen_toy_nowhere", "plug-in 'specgen_toy_nowhere' ($SPECGEN_PLUGINS) failed to load: "
                                "ModuleNotFoundError: No module named 'specgen_toy_nowhere'"),
        ("specgen_toy_engine:", "plug-in 'specgen_toy_engine:' ($SPECGEN_PLUGINS) must be 'module' or 'module:function'"),
        ("specgen_toy_fork_model:NAME", "plug-in 'specgen_toy_fork_model:NAME' ($SPECGEN_PLUGINS) failed to load: "
                                        "TypeError: NAME is neither a module nor a function"),
        ("specgen_toy_fork_model:nothing", "failed to load: AttributeError: module 'specgen_toy_fork_model' has "
                                           "no attribute 'nothing'"),
    ]:
        toy_path.setenv(PLUGINS_ENV, setting)
        with pytest.raises(PluginError) as raised:
            load_plugins()
        assert expected in str(raised.value)
    assert loaded_plugins() == []


def test_the_command_offers_a_plugins_engine_and_refuses_a_broken_plugin(
        toy_path: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from specgen.cli import build_parser, main

    toy_path.setenv(PLUGINS_ENV, "specgen_toy_nowhere")
    assert main(["--help"]) == 2
    assert "specgen: error: plug-in 'specgen_toy_nowhere' ($SPECGEN_PLUGINS) failed to load" in capsys.readouterr().err
    toy_path.setenv(PLUGINS_ENV, TOY_PLUGINS)
    with pytest.raises(SystemExit):
        main(["--help"])      # loads the plug-ins first, then prints the help
    assert build_parser().parse_args(["optimize", "--llm", "toy", "--fork-model", "toy-fork"]).llm == "toy"


def test_an_entry_point_of_an_installed_distribution_is_loaded(clean_plugins: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """`[project.entry-points."specgen.plugins"]` of a package: its dist-info on the path is enough."""
    (tmp_path / "toy_dist_plugin.py").write_text("CALLS = []\n\ndef register():\n    CALLS.append(1)\n")
    info = tmp_path / "toy_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntoy = toy_dist_plugin:register\n")
    clean_plugins.syspath_prepend(str(tmp_path))
    assert load_plugins() == load_plugins() == ["toy_dist_plugin:register"]
    assert sys.modules["toy_dist_plugin"].CALLS == [1]
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nbroken = toy_dist_plugin_broken\n")
    (tmp_path / "toy_dist_plugin_broken.py").write_text("raise RuntimeError('broken on purpose')\n")
    with pytest.raises(PluginError, match="plug-in 'toy_dist_plugin_broken' \\(entry point 'broken' of "
                                          "toy-dist in 'specgen.plugins'\\) failed to load: RuntimeError"):
        load_plugins()


def _toy_job(problem: str):
    """The job as `specgen optimize --llm toy` builds it: typed, decoded strictly where it runs."""
    from specgen.messages import OptimizeSpec
    from specgen.optimize.job import JobConfig
    from specgen.traces.bundled import bundled_problem

    spec = OptimizeSpec(job_id="", problem_name=problem, problem_source=bundled_problem(problem).read_text(),
                        max_iterations=1)
    return JobConfig(optimize=spec, engine=engine_spec({"llm": "toy"})).to_job()


def test_a_plugins_engine_and_fork_model_run_a_job_in_a_local_cluster(toy_path: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """Loaded in this process only, the plug-ins are unknown to the job's reasoner, which the
    cluster's scheduler starts; named by the setting, every process of the cluster loads them and
    the job runs on the toy engine, its forks written by the toy fork model."""
    from specgen.optimize.job import optimize_result
    from specgen.runtime.local import LocalCluster

    toy_path.setenv(PLUGINS_ENV, TOY_PLUGINS)
    load_plugins()
    toy_path.delenv(PLUGINS_ENV)             # this process has them; the cluster's are not told
    with LocalCluster(workers=1, evaluator="replay", state_dir=tmp_path / "alone") as cluster:
        assert cluster.client is not None
        outcome = cluster.client.submit(_toy_job("fused_elementwise")).result(timeout=120)
    assert outcome.status == "failed"
    assert "got 'toy' (plug-ins loaded in this process: none" in (outcome.error or "")

    toy_path.setenv(PLUGINS_ENV, TOY_PLUGINS)
    with LocalCluster(workers=1, evaluator="replay", state_dir=tmp_path / "told") as cluster:
        assert cluster.client is not None
        outcome = cluster.client.submit(_toy_job("fused_elementwise")).result(timeout=300)
    assert outcome.status == "succeeded", outcome.error
    result = optimize_result(outcome)
    assert result.engine == "toy" and result.metrics.forks > 0
    from specgen_toy_fork_model import MARK

    forked = [c for c in result.candidates if c.origin == "fork"]
    assert forked and all(MARK in c.source for c in forked)
