"""The command line's own behaviour: errors raised on purpose reach the user as one line."""
from __future__ import annotations

import functools

import specgen.runtime.client as client_module
from specgen.cli import main


def test_an_unreachable_scheduler_is_one_line_and_exit_code_1(monkeypatch, capsys) -> None:
    # A short connect timeout, so the test does not wait the default 15 s for nobody.
    monkeypatch.setattr(client_module, "RuntimeSettings",
                        functools.partial(client_module.RuntimeSettings, connect_timeout_s=0.5))
    code = main(["status", "--scheduler", "tcp://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("specgen status: error: no answer from the scheduler at tcp://127.0.0.1:9")
    assert "Traceback" not in err
