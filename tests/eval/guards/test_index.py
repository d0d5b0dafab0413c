"""The guard list in `specgen.eval.guards` stays whole: every flag code is raised by a listed guard,
and every listed guard names code that exists."""
from __future__ import annotations

import importlib

from specgen.eval.guards import FLAG_CODES, GUARDS


def test_every_flag_code_has_a_guard() -> None:
    raised = {code for guard in GUARDS for code in guard.flags.split()}
    assert set(FLAG_CODES) - raised == set()
    assert raised - set(FLAG_CODES) == set()


def test_every_guard_names_existing_code() -> None:
    for guard in GUARDS:
        module, qualname = guard.where.split(":")
        obj = importlib.import_module(f"specgen.eval.{module}")
        for part in qualname.split("."):
            obj = getattr(obj, part)
        assert callable(obj), guard.where
        assert guard.stops, guard.where


def test_importing_the_list_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, specgen.eval.guards; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
