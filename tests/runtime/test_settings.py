import pytest

from specgen.errors import UsageError
from specgen.runtime.settings import SETTINGS_ENV, RuntimeSettings, settings_from_env


def test_overrides_parse_json_and_check(monkeypatch: pytest.MonkeyPatch) -> None:
    s = RuntimeSettings().with_overrides(["pool_mode=static", "static_validate_workers=3",
                                          'priority_rule=["deadline","oldest"]', "peer_timeout_s=9"])
    assert s.pool_mode == "static" and s.static_validate_workers == 3 and s.peer_timeout_s == 9.0
    monkeypatch.setenv(SETTINGS_ENV, s.to_env())
    assert settings_from_env() == s


@pytest.mark.parametrize("pair, message", [
    ("nonsense=1", "NAME=VALUE"),
    ("pool_mode=wobbly", "pool_mode"),
    ('priority_rule=["luck"]', "unknown criteria"),
    ("peer_timeout_s=0.1", "peer_timeout_s must exceed"),
    ("heartbeat_interval_s=-1", "must be positive"),
    ("max_queued_requests=lots", "bad --set value"),
    ('eval_options={"l2_flush_mb": 0}', r"unknown field `l2_flush_mb` - at `\$.eval_options` \(the fields are EvalOptions'"),
    ('eval_options={"trials": "many"}', r"Expected `int`, got `str` - at `\$.eval_options.trials`"),
])
def test_bad_overrides_name_what_to_fix(pair: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        RuntimeSettings().with_overrides([pair])
