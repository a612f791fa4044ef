"""The worker's batching flags as Triton's and Ray Serve's settings (what ``gpuscope
tune`` prints under its verdict)."""

from __future__ import annotations

import pytest

from gpuscope import flags
from gpuscope.loadgen import batching_equivalents
from gpuscope.loadgen.batching_equivalents import Batching, for_tune, lines, ray_serve, triton
from gpuscope.loadgen.tune import TuneOptions


def test_dynamic_batching_becomes_tritons_dynamic_batcher_and_ray_serves_decorator() -> None:
    batching = Batching("dynamic", 16, 5.0)
    assert triton(batching) == (
        "max_batch_size: 16  dynamic_batching { preferred_batch_size: [ 16 ]"
        " max_queue_delay_microseconds: 5000 }"
    )
    assert ray_serve(batching) == "@serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)"


@pytest.mark.parametrize(
    ("window_ms", "micros", "seconds"),
    [(0.1, 100, "0.0001"), (0.25, 250, "0.00025"), (2.5, 2500, "0.0025"), (0.0004, 0, "4e-07")],
)
def test_windows_convert_to_microseconds_and_seconds(
    window_ms: float, micros: int, seconds: str
) -> None:
    batching = Batching("dynamic", 4, window_ms)
    assert f"max_queue_delay_microseconds: {micros} }}" in str(triton(batching))
    assert f"batch_wait_timeout_s={seconds})" in str(ray_serve(batching))


def test_static_batching_has_no_window() -> None:
    """The worker's static batching takes what is queued when the device is free,
    whatever --max-queue-delay-ms says."""
    batching = Batching("static", 8, 5.0)
    assert "max_queue_delay_microseconds: 0 }" in str(triton(batching))
    assert "batch_wait_timeout_s=0)" in str(ray_serve(batching))


def test_no_batching_and_continuous_batching() -> None:
    assert lines(Batching("none", 1, 5.0))[1:] == [
        "  Triton (config.pbtxt):  no dynamic_batching block (each request runs alone)",
        "  Ray Serve:              no @serve.batch (each call runs alone)",
    ]
    (only,) = lines(Batching("continuous", 16, 5.0))
    assert "no Triton dynamic_batching or Ray Serve @serve.batch equivalent" in only


def test_the_printed_lines_say_the_recommendation_transfers_only_when_model_and_load_match() -> (
    None
):
    printed = lines(Batching("dynamic", 16, 1.0))
    assert printed[0] == batching_equivalents.CAVEAT
    assert "model and the load match" in printed[0]
    assert [line.split(":")[0].strip() for line in printed[1:]] == [
        "Triton (config.pbtxt)",
        "Ray Serve",
    ]


def test_tune_takes_the_best_value_with_its_worker_args() -> None:
    """The swept value wins over --worker-args; the other flag comes from there (or the
    worker's default)."""
    options = flags.parse(
        TuneOptions,
        ["--sweep", "max-queue-delay-ms=0.5,2", "--worker-args", "--max-batch-size 8"],
        environ={},
    )
    printed = for_tune(options, "max-queue-delay-ms=0.5")
    assert "max_batch_size: 8  dynamic_batching { preferred_batch_size: [ 8 ]" in printed[1]
    assert "max_queue_delay_microseconds: 500 }" in printed[1]
    assert "@serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0005)" in printed[2]
    swept_size = flags.parse(TuneOptions, ["--sweep", "max-batch-size=4,32"], {})
    # the worker's default window (5 ms) with the winning size
    assert (
        "max_batch_size=32, batch_wait_timeout_s=0.005)"
        in for_tune(swept_size, "max-batch-size=32")[2]
    )


def test_tune_prints_nothing_when_no_value_won() -> None:
    options = flags.parse(TuneOptions, ["--sweep", "max-queue-delay-ms=0.5,2"], {})
    assert for_tune(options, None) == []
