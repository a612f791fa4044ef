"""``cpu_budget`` on its own: a finalizer that the garbage collector runs on the ingest
thread while the budget runs out must neither swallow the refusal nor be interrupted."""

from __future__ import annotations

import sys
import time
import weakref

import pytest

from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.decode_budget import DECODE_BUDGET, cpu_budget, needs_watching
from support.exporter_fixtures import SpanFactory, encode, otlp_json


def _work(calls: int) -> int:
    return sum(abs(number) for number in range(calls))


def _spend(seconds: float) -> None:
    """Python calls (which the hook counts) until ``seconds`` of this thread's CPU."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        _work(50)


class _Finalized:
    """Spends the rest of the budget in its ``__del__``, as an event loop's transport
    collected on the ingest thread did (seen in CI: 76 spans counted for 75)."""

    finished = False

    def __del__(self) -> None:
        _spend(0.05)
        type(self).finished = True


def test_a_budget_spent_in_a_finalizer_is_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    _Finalized.finished = False
    with pytest.raises(otlp.OtlpError) as refused:
        _decode_beside_a_finalizer()
    assert refused.value.status == 413 and refused.value.reason == DECODE_BUDGET
    assert _Finalized.finished  # the finalizer ran to its end
    assert unraisable == []  # nothing raised inside it


class _Registered:
    """Spends the rest of the budget in its ``__del__``; CPython then clears its weak
    references, so a ``WeakValueDictionary``'s removal callback runs next, on this
    thread, in no ``__del__`` (seen in CI: ``_Spent`` raised in ``weakref.remove``)."""

    def __del__(self) -> None:
        _spend(0.05)


def test_a_budget_spent_before_a_weakref_callback_is_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    registry: weakref.WeakValueDictionary[str, _Registered] = weakref.WeakValueDictionary()
    reached: list[bool] = []
    with pytest.raises(otlp.OtlpError) as refused:
        _decode_beside_a_weakref_callback(registry, reached)
    assert refused.value.status == 413 and refused.value.reason == DECODE_BUDGET
    assert "held" not in registry  # the callback ran to its end
    assert unraisable == []  # nothing raised inside it
    assert reached == []  # and the decode was stopped, not run to its end


def test_a_decode_within_its_budget_passes() -> None:
    with cpu_budget(5.0, lambda: False):
        assert _work(10_000) > 0


def test_a_decode_past_its_budget_is_stopped_before_its_end() -> None:
    reached: list[bool] = []
    with pytest.raises(otlp.OtlpError):
        _decode_past_the_budget(reached)
    assert reached == []


def _decode_beside_a_finalizer() -> None:
    with cpu_budget(0.01, lambda: False):
        _Finalized()  # collected at once, its __del__ on this thread
        _work(10)  # the decode goes on, short, and ends


def _decode_beside_a_weakref_callback(
    registry: weakref.WeakValueDictionary[str, _Registered], reached: list[bool]
) -> None:
    with cpu_budget(0.01, lambda: False):
        registry["held"] = _Registered()  # dropped at once: __del__, then the callback
        _spend(1.0)  # the decode goes on: the hook must still be there to stop it
        reached.append(True)


def _decode_past_the_budget(reached: list[bool]) -> None:
    with cpu_budget(0.01, lambda: False):
        _spend(1.0)
        reached.append(True)


def test_a_body_of_plain_values_is_watched_too() -> None:
    """Objects and arrays alone did not say what a body costs: a million numbers in one
    array (4 KB gzipped) decoded unwatched for 0.7-1.0 s, past a quarter of the budget.
    The SDK's own requests (512 spans) stay unwatched: the hook costs as much again."""
    numbers = b'{"x": [' + b",".join(b"1.5" for _ in range(1_000_000)) + b"]}"
    assert needs_watching(numbers, otlp.JSON, 2.0)
    assert not needs_watching(numbers, otlp.PROTOBUF, 2.0)  # one C call, no hook can stop
    spans = SpanFactory()
    sdk_request = otlp_json(encode([spans.server(0.01) for _ in range(512)]))
    assert not needs_watching(sdk_request, otlp.JSON, 2.0)
