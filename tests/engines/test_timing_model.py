"""The timing model: the decode curve, time to first token, overrides, the curve fit."""
from __future__ import annotations

import pytest

from specgen.engines.timing_model import TimingModel, fit_decode_curve
from specgen.errors import UsageError


def test_defaults_reproduce_the_published_rates() -> None:
    model = TimingModel()
    for running in (1, 8, 32):
        assert model.decode_tps(running) == pytest.approx(56.0)
    assert model.decode_tps(128) == pytest.approx(26.7, rel=0.02)
    assert model.decode_tps(64) < model.decode_tps(32)


def test_ttft_charges_only_what_is_not_cached() -> None:
    model = TimingModel(prefill_tps=1000.0, ttft_floor_s=0.1, kv_fetch_tps=100_000.0)
    assert model.ttft_s(2000) == pytest.approx(2.1)
    assert model.ttft_s(2000, cached_tokens=1990) == pytest.approx(0.11)
    assert model.ttft_s(2000, fetched_tokens=2000) == pytest.approx(0.12)
    with pytest.raises(ValueError):
        model.ttft_s(10, cached_tokens=11)


def test_overrides_name_what_is_wrong() -> None:
    model = TimingModel.from_overrides(["r1=28", "knee=8"])
    assert model.r1 == 28 and model.knee == 8 and "overridden" in model.source
    with pytest.raises(UsageError, match="unknown setting 'speed'"):
        TimingModel.from_overrides(["speed=2"])
    with pytest.raises(UsageError, match="is not a number"):
        TimingModel.from_overrides(["r1=fast"])
    with pytest.raises(UsageError, match="must be > 0"):
        TimingModel.from_overrides(["r1=0"])
    assert TimingModel().scaled(0.5).r1 == pytest.approx(28.0)


def test_fit_recovers_a_curve() -> None:
    truth = TimingModel(r1=40.0, knee=2.0, beta=0.7)
    fitted = fit_decode_curve({n: truth.decode_tps(n) for n in (1, 2, 4, 8)})
    for n in (1, 2, 4, 8):
        assert fitted.decode_tps(n) == pytest.approx(truth.decode_tps(n), rel=1e-6)
