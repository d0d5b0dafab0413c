"""connect and cluster_settings: one entry to a scheduler of each kind, and the settings of a cluster a run starts."""
from __future__ import annotations

import asyncio

import pytest

from specgen.errors import UsageError
from specgen.messages import EvalOptions
from specgen.runtime.connect import KINDS, connect, cluster_settings
from specgen.runtime.inprocess import InProcessCluster
from specgen.runtime.settings import RuntimeSettings


def test_an_inprocess_cluster_comes_up_with_a_worker_per_device() -> None:
    async def scenario():
        async with connect("inprocess", devices=["cpu"], settings=RuntimeSettings(spare_processes=0)) as cluster:
            assert isinstance(cluster, InProcessCluster) and cluster.failure is None
            return await asyncio.to_thread(cluster.client.stats)

    stats = asyncio.run(scenario())
    assert len(stats.workers) == 1 and stats.workers[0].device == "cpu"


@pytest.mark.parametrize("kind, kwargs, named", [
    ("cloud", {"devices": ["cpu"]}, "no scheduler kind 'cloud'"),
    ("remote", {}, "address"),
    ("local", {}, "devices"),
    ("inprocess", {"devices": []}, "devices"),
])
def test_what_is_missing_or_wrong_is_a_usage_error_naming_it(kind: str, kwargs: dict, named: str) -> None:
    async def scenario() -> None:
        async with connect(kind, **kwargs):
            raise AssertionError("no cluster should come up")

    with pytest.raises(UsageError, match=named) as err:
        asyncio.run(scenario())
    if kind == "cloud":
        assert all(k in str(err.value) for k in KINDS)


def test_cluster_settings_take_the_pool_mode_the_eval_options_then_the_overrides() -> None:
    options = {"trials": 2}
    elastic = cluster_settings(True, options)
    assert elastic.pool_mode == "elastic" and elastic.eval_options == EvalOptions(trials=2)
    options["trials"] = 9                                   # typed once: the caller's dict is its own
    assert elastic.eval_options == EvalOptions(trials=2)
    static = cluster_settings(False, {}, ["spare_processes=0", 'eval_options={"trials": 3}'])
    assert (static.pool_mode, static.spare_processes, static.eval_options) == ("static", 0, EvalOptions(trials=3))
    assert cluster_settings(False, {}, ["pool_mode=elastic"]).pool_mode == "elastic"   # the override wins


def test_cluster_settings_refuse_an_unknown_name_or_a_bad_value() -> None:
    with pytest.raises(UsageError, match="NAME=VALUE"):
        cluster_settings(True, {}, ["no_such_setting=1"])
    with pytest.raises(UsageError, match="pool_mode"):
        cluster_settings(True, {}, ["pool_mode=sometimes"])
    with pytest.raises(UsageError, match="eval_options"):
        cluster_settings(True, {"no_such_option": 1})
