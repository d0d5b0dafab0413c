"""load_inline in runners: a build runner's session (real compiles on this host: g++, and nvcc
where it is installed), the compiler's words in a failed build's record, and a candidate runner
that loads what a build made and refuses, compiling nothing, what no build made."""
from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.utils.cpp_extension as cpp_extension  # noqa: E402

from specgen.eval import extensions  # noqa: E402
from specgen.eval.extensions import (BuildSession, ExtensionBuildError, KernelLedger,  # noqa: E402
                                     ProbeStop, compiler_message, publish_builds)
from specgen.messages import BuildResult, BuiltLibrary  # noqa: E402

REAL = cpp_extension.load_inline

NINJA_OUTPUT = """Error building extension 'rms_norm_cuda': [1/3] /usr/local/cuda/bin/nvcc -MD -MF cuda.cuda.o.d -DTORCH_EXTENSION_NAME=rms_norm_cuda -isystem /venv/torch/include -c /tmp/specgen-run-x/build/rms_norm_cuda-abc/cuda.cu -o cuda.cuda.o
FAILED: cuda.cuda.o
/usr/local/cuda/bin/nvcc -MD -MF cuda.cuda.o.d -DTORCH_EXTENSION_NAME=rms_norm_cuda -isystem /venv/torch/include -c /tmp/specgen-run-x/build/rms_norm_cuda-abc/cuda.cu -o cuda.cuda.o
/tmp/specgen-run-x/build/rms_norm_cuda-abc/cuda.cu(12): error: identifier "undeclared_value" is undefined
      y[0] = undeclared_value;
             ^

1 error detected in the compilation of "/tmp/specgen-run-x/build/rms_norm_cuda-abc/cuda.cu".
[2/3] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=rms_norm_cuda -fPIC -std=c++20 -c /tmp/specgen-run-x/build/rms_norm_cuda-abc/main.cpp -o main.o
ninja: build stopped: subcommand failed.
"""


def test_the_compilers_first_error_lines_replace_the_command_lines() -> None:
    message = compiler_message(RuntimeError(NINJA_OUTPUT),
                               Path("/tmp/specgen-run-x/build/rms_norm_cuda-abc"))
    assert message.startswith("RuntimeError: Error building extension 'rms_norm_cuda':\n")
    assert 'cuda.cu(12): error: identifier "undeclared_value" is undefined' in message
    assert "y[0] = undeclared_value;" in message          # the source line, with its caret
    assert "-isystem" not in message and "[1/3]" not in message and "ninja:" not in message
    assert "/tmp/specgen-run-x" not in message


def test_a_message_is_bounded_and_other_failures_are_their_own_words() -> None:
    many = "Error building extension 'x': " + "".join(
        f"main.cpp:{i}:1: error: '{'a' * 80}' was not declared in this scope\n" for i in range(200))
    assert len(compiler_message(RuntimeError(many))) <= 2000
    plain = compiler_message(OSError("CUDA_HOME environment variable is not set."))
    assert plain == "OSError: CUDA_HOME environment variable is not set."


@pytest.fixture()
def restore_load_inline():
    yield
    cpp_extension.load_inline = REAL


def session(tmp_path: Path, scope: str = "scope") -> tuple[BuildSession, KernelLedger]:
    ledger = KernelLedger()
    return BuildSession(REAL, tmp_path / "cache", tmp_path / "build", ledger, scope), ledger


ADD_ONE = "torch::Tensor add_one(torch::Tensor x) { return x + 1; }"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildSession, KernelLedger]:
    """One real C++ build (tens of seconds here), shared by the tests that need a library."""
    root = tmp_path_factory.mktemp("built")
    build, ledger = session(root)
    build.load_inline(name="specgen_add_one", cpp_sources=ADD_ONE, functions=["add_one"],
                      verbose=True)
    return root, build, ledger


def test_a_build_compiles_once_and_its_library_loads_in_a_run(
        built: tuple[Path, BuildSession, KernelLedger], restore_load_inline: None) -> None:
    root, build, ledger = built
    again = build.load_inline(name="specgen_add_one", cpp_sources=ADD_ONE, functions=["add_one"])
    assert len(ledger.builds) == 1 and ledger.builds[0].ok and ledger.libraries[0]
    assert torch.equal(again.add_one(torch.zeros(3)), torch.ones(3))
    publish_builds(root / "cache", "scope", BuildResult(
        records=ledger.builds, libraries=[BuiltLibrary(key=ledger.builds[0].key, name="specgen_add_one",
                                                        data=Path(ledger.libraries[0]).read_bytes())]))
    run_ledger = KernelLedger()
    extensions.install("run", root / "cache", root / "run-build", run_ledger, "scope")
    module = cpp_extension.load_inline(name="specgen_add_one", cpp_sources=ADD_ONE,
                                       functions=["add_one"], verbose=False)
    assert torch.equal(module.add_one(torch.ones(2)), torch.full((2,), 2.0))
    assert not (root / "run-build").exists()          # loaded, not compiled
    assert run_ledger.builds[0].cached and run_ledger.launches == 1


def test_a_run_refuses_a_call_no_build_made_and_compiles_nothing(
        tmp_path: Path, restore_load_inline: None) -> None:
    ledger = KernelLedger()
    extensions.install("run", tmp_path / "cache", tmp_path / "build", ledger, "scope")
    with pytest.raises(ExtensionBuildError, match="was not built ahead: the runner compiles nothing"):
        cpp_extension.load_inline(name="specgen_late", cpp_sources=ADD_ONE, functions=["add_one"])
    assert not ledger.builds[0].ok and "not built ahead" in ledger.builds[0].error
    assert not (tmp_path / "build").exists()


def test_extension_functions_do_not_run_while_the_build_probes(
        built: tuple[Path, BuildSession, KernelLedger]) -> None:
    _, build, _ = built
    module = build.load_inline(name="specgen_add_one", cpp_sources=ADD_ONE, functions=["add_one"])
    build.probing = True
    try:
        with pytest.raises(ProbeStop):
            module.add_one(torch.empty(3, device="meta"))
    finally:
        build.probing = False


def test_two_sources_of_one_name_both_load(
        built: tuple[Path, BuildSession, KernelLedger], tmp_path: Path) -> None:
    # Each compiled under the name and its key: the second is not the first's symbols again.
    _, build, ledger = built
    other = build.load_inline(name="specgen_add_one", functions=["add_one"],
                              cpp_sources=ADD_ONE.replace("x + 1", "x + 2"))
    assert torch.equal(other.add_one(torch.zeros(1)), torch.full((1,), 2.0))
    first = build.load_inline(name="specgen_add_one", cpp_sources=ADD_ONE, functions=["add_one"])
    assert torch.equal(first.add_one(torch.zeros(1)), torch.ones(1))
    assert other.__name__.startswith("specgen_add_one_") and other.__name__ != first.__name__


def test_a_failed_cpp_build_records_the_compilers_error(tmp_path: Path) -> None:
    build, ledger = session(tmp_path)
    with pytest.raises(RuntimeError):
        build.load_inline(name="specgen_broken_cpp", functions=["f"], verbose=True,
                          cpp_sources="torch::Tensor f(torch::Tensor x) { return x + 1 }")
    record = ledger.builds[0]
    assert not record.ok and "expected ';'" in record.error.replace("‘", "'").replace("’", "'")
    assert "main.cpp:2:" in record.error and "-isystem" not in record.error, record.error
    assert record.error.startswith("RuntimeError: Error building extension 'specgen_broken_cpp':\n")
    # A second call of the same arguments fails again at once, compiling nothing.
    with pytest.raises(RuntimeError):
        build.load_inline(name="specgen_broken_cpp", functions=["f"],
                          cpp_sources="torch::Tensor f(torch::Tensor x) { return x + 1 }")
    assert len(ledger.builds) == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_failed_nvcc_build_records_the_compilers_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if cpp_extension.CUDA_HOME is None:
        # A CPU build of torch compiles no CUDA source unless told where CUDA is.
        nvcc = Path(shutil.which("nvcc")).resolve()
        home = next((p for p in (Path("/usr/local/cuda"), nvcc.parent.parent)
                     if (p / "bin" / "nvcc").exists()), None)
        if home is None:
            pytest.skip("no CUDA installation folder beside nvcc")
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(home))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    build, ledger = session(tmp_path)
    with pytest.raises(RuntimeError):
        build.load_inline(name="specgen_broken_cuda", cpp_sources="void f();", functions=["f"],
                          cuda_sources='#error "this kernel never builds"\nvoid f() {}\n')
    record = ledger.builds[0]
    assert not record.ok and "#error" in record.error and "this kernel never builds" in record.error
    assert "cuda.cu:" in record.error and "nvcc -" not in record.error, record.error


def test_the_session_keeps_torchs_signature(tmp_path: Path, restore_load_inline: None) -> None:
    extensions.install("build", tmp_path / "cache", tmp_path / "build", KernelLedger(), "s")
    assert inspect.signature(cpp_extension.load_inline) == inspect.signature(REAL)
