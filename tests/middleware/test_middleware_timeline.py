"""RequestTimeline: marks, their order rules, and the phases derived from them."""

from __future__ import annotations

import threading

import pytest

from gpuscope.middleware import RequestTimeline, stats
from gpuscope.middleware.timeline import (
    ADMITTED,
    ARRIVED,
    COMPUTED,
    DISPATCHED,
    ENQUEUED,
    FINISHED,
)


@pytest.fixture(autouse=True)
def _fresh_stats() -> None:
    stats.reset()


def full_timeline(step_ns: int = 1_000_000) -> RequestTimeline:
    timeline = RequestTimeline()
    arrived = timeline.mark_ns(ARRIVED)
    assert arrived is not None
    for i, index in enumerate((ENQUEUED, ADMITTED, DISPATCHED, COMPUTED), start=1):
        timeline.mark_at(index, arrived + i * step_ns)
    timeline.finish(arrived + 5 * step_ns)
    return timeline


def test_phases_add_up_to_the_duration() -> None:
    timeline = full_timeline()
    phases = timeline.phase_seconds()
    assert list(phases) == ["preprocess", "queue", "batch_wait", "compute", "postprocess"]
    assert phases == pytest.approx(dict.fromkeys(phases, 0.001))
    duration = timeline.duration_seconds()
    assert duration is not None
    assert sum(phases.values()) == pytest.approx(duration)


def test_marks_in_real_time_are_monotonic_and_sum_to_duration() -> None:
    timeline = RequestTimeline()
    timeline.enqueued()
    timeline.admitted()
    timeline.dispatched()
    timeline.computed()
    assert timeline.finish(timeline.mark_ns(COMPUTED) or 0)
    marks = [timeline.mark_ns(i) for i in range(6)]
    assert all(m is not None for m in marks)
    assert marks == sorted(marks)  # type: ignore[type-var]
    assert sum(timeline.phase_seconds().values()) == pytest.approx(timeline.duration_seconds())


def test_a_mark_that_never_happened_leaves_its_phases_absent() -> None:
    timeline = RequestTimeline()
    timeline.dispatched()
    timeline.computed()
    timeline.finish(timeline.mark_ns(COMPUTED) or 0)
    assert set(timeline.phase_seconds()) == {"compute", "postprocess"}


def test_marks_are_idempotent_the_first_value_wins() -> None:
    timeline = RequestTimeline()
    arrived = timeline.mark_ns(ARRIVED) or 0
    timeline.mark_at(ENQUEUED, arrived + 10)
    timeline.mark_at(ENQUEUED, arrived + 20)
    assert timeline.mark_ns(ENQUEUED) == arrived + 10
    assert stats.snapshot().get("marks_out_of_order", 0) == 0


def test_a_mark_dated_before_an_earlier_mark_is_ignored_and_counted() -> None:
    # A scheduler thread reads the clock when it takes an item, just before the handler,
    # which queued the item first, marks ``enqueued``: admitted would precede enqueued.
    timeline = RequestTimeline()
    arrived = timeline.mark_ns(ARRIVED) or 0
    timeline.mark_at(ENQUEUED, arrived + 2_000)
    timeline.mark_at(ADMITTED, arrived + 1_000)
    timeline.mark_at(DISPATCHED, arrived + 3_000)
    timeline.mark_at(COMPUTED, arrived - 1)  # before the request even arrived
    timeline.finish(arrived + 4_000)
    assert timeline.mark_ns(ADMITTED) is None
    assert timeline.mark_ns(COMPUTED) is None
    assert timeline.ignored_marks == 2
    assert stats.snapshot()["marks_out_of_order"] == 2
    assert all(seconds >= 0 for seconds in timeline.phase_seconds().values())


def test_a_mark_after_a_later_one_is_ignored_and_counted() -> None:
    timeline = RequestTimeline()
    timeline.dispatched()
    timeline.admitted()  # too late: the batch already left
    assert timeline.mark_ns(ADMITTED) is None
    assert timeline.ignored_marks == 1
    assert stats.snapshot()["marks_out_of_order"] == 1


def test_marks_after_finish_are_ignored_and_counted_apart() -> None:
    timeline = RequestTimeline()
    timeline.finish(timeline.mark_ns(ARRIVED) or 0)
    timeline.computed()
    timeline.first_token()
    assert timeline.mark_ns(COMPUTED) is None
    assert timeline.first_token_ns is None
    assert {k: v for k, v in stats.snapshot().items() if v} == {"marks_after_finish": 1}


def test_finish_happens_once() -> None:
    timeline = RequestTimeline()
    assert timeline.finish(123)
    assert not timeline.finish(456)
    assert timeline.mark_ns(FINISHED) == 123


def test_streaming_figures() -> None:
    timeline = RequestTimeline()
    arrived = timeline.mark_ns(ARRIVED) or 0
    timeline.first_token()
    first = timeline.first_token_ns
    assert first is not None
    timeline.add_output_tokens(5)
    timeline.finish(first + 40_000_000)
    ttft, tpot = timeline.streaming_seconds()
    assert ttft == pytest.approx((first - arrived) / 1e9)
    assert tpot == pytest.approx(0.040 / 4)


def test_time_per_output_token_needs_two_tokens() -> None:
    timeline = RequestTimeline()
    timeline.first_token()
    timeline.set_tokens(output_tokens=1)
    timeline.finish((timeline.first_token_ns or 0) + 1000)
    assert timeline.streaming_seconds()[1] is None


def test_marks_from_another_thread_are_kept() -> None:
    timeline = RequestTimeline()
    timeline.enqueued()

    def scheduler_thread() -> None:
        timeline.admitted()
        timeline.dispatched()

    worker = threading.Thread(target=scheduler_thread)
    worker.start()
    worker.join()
    assert timeline.mark_ns(ADMITTED) is not None
    assert timeline.mark_ns(DISPATCHED) is not None


def test_the_first_batch_is_the_one_recorded() -> None:
    timeline = RequestTimeline()
    timeline.set_batch("a-1", 4)
    timeline.set_batch("a-2", 8)
    assert (timeline.batch_id, timeline.batch_size) == ("a-1", 4)


def test_a_mark_that_slips_in_after_finish_never_makes_a_phase_negative() -> None:
    # The race: another thread passed the "not finished" check, then finish() ran,
    # then the mark was written with a later reading. Reproduced by writing directly.
    timeline = RequestTimeline()
    arrived = timeline.mark_ns(ARRIVED) or 0
    timeline.mark_at(DISPATCHED, arrived + 10)
    timeline.first_token()
    timeline.finish(arrived + 100)
    timeline._marks[COMPUTED] = arrived + 200
    timeline._first_token_ns = arrived + 300
    assert timeline.phases_ns() == {}  # compute and postprocess need the dropped mark
    assert all(seconds >= 0 for seconds in timeline.phase_seconds().values())
    assert timeline.streaming_seconds() == (None, None)
