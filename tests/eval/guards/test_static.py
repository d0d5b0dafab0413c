"""The source scan: each pattern of a known hack gives its flag; honest code gives none."""
from __future__ import annotations

import ast

import pytest

from specgen.eval.guards import FLAG_CODES, flag_code
from specgen.eval.guards.static import scan_source
from tests.eval.conftest import BUNDLED, HERE


def scan(source: str) -> list[str]:
    return [flag_code(f) for f in scan_source(ast.parse(source))]


@pytest.mark.parametrize("code, source", [
    ("try-fallback", "try:\n    y = kernel(x)\nexcept Exception:\n    y = torch.relu(x)\n"),
    ("timer-patch", "import time\ntime.perf_counter = lambda: 0.0\n"),
    ("timer-patch", "import torch\ntorch.cuda.Event.elapsed_time = lambda s, e: 0.0\n"),
    ("timer-patch", "from torch import cuda\ncuda.synchronize = lambda: None\n"),
    ("monkey-patch", "import torch\ntorch.matmul = lambda a, b: a\n"),
    ("monkey-patch", "import torch\nsetattr(torch, 'softmax', None)\n"),
    ("thread", "import threading\n"),
    ("thread", "from concurrent.futures import ThreadPoolExecutor\n"),
    ("thread", "src = '''#include <thread>\nvoid f() { std::thread t(g); t.detach(); }'''\n"),
    ("side-stream", "import torch\ns = torch.cuda.Stream()\n"),
    ("side-stream", "import torch\nwith torch.cuda.stream(s):\n    pass\n"),
    ("side-stream", "cuda_src = 'auto s = at::cuda::getStreamFromPool(); kernel<<<1, 1, 0, s>>>();'\n"),
    ("lazy-tensor", "import torch\nclass Lazy(torch.Tensor):\n    pass\n"),
    ("lazy-tensor", "class Lazy:\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
                    "        pass\n"),
    ("lazy-tensor", "y = torch.Tensor._make_subclass(Cls, x)\n"),
    ("memoized", "import functools\n@functools.lru_cache\ndef f(shape):\n    pass\n"),
    ("memoized", "cache = {}\ndef f(x):\n    return cache[x.data_ptr()]\n"),
    ("memoized", "def f(self, x):\n    if id(x) == self.last_id:\n        return self.out\n"),
    ("precision", "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n"),
    ("precision", "import torch\ntorch.set_float32_matmul_precision('medium')\n"),
    ("precision", "import torch\nwith torch.autocast('cuda'):\n    pass\n"),
    ("introspection", "import gc\n"),
    ("introspection", "import sys\nf = sys._getframe(1).f_locals\n"),
    ("introspection", "import sys\nm = sys.modules['__main__']\n"),
    ("introspection", "import ctypes\n"),
])
def test_pattern_is_flagged(code: str, source: str) -> None:
    assert code in FLAG_CODES
    assert code in scan(source)


@pytest.mark.parametrize("source", [
    "try:\n    import triton\nexcept ImportError:\n    triton = None\n",
    "try:\n    y = f(x)\nexcept ValueError as exc:\n    raise RuntimeError('bad') from exc\n",
    "import torch\ntorch.backends.cudnn.benchmark = True\n",
    "import torch\nstream = torch.cuda.current_stream()\n",
    "def f(x):\n    assert x.data_ptr() % 16 == 0\n",
    "import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'\n",
    "class M:\n    def forward(self, x):\n        self.cache = x.shape\n        return x.half().float()\n",
])
def test_honest_patterns_are_not_flagged(source: str) -> None:
    assert scan(source) == []


def test_flags_name_the_line() -> None:
    flags = scan_source(ast.parse("import torch\n\n\ntorch.softmax = None\n"))
    assert flags == ["monkey-patch: line 4: replaces torch.softmax"]


def test_bundled_and_honest_candidates_scan_clean() -> None:
    paths = list((BUNDLED / "candidates").glob("*.py")) + list((HERE / "honest").glob("*.py"))
    assert paths
    for path in paths:
        assert scan_source(ast.parse(path.read_text())) == [], path.name
