"""Samples a GPU source in one background thread and keeps the latest snapshot.

A scrape reads ``snapshot()``: one attribute load of an immutable object and a look at
the clock, so it never waits on NVML, however slow a sample is. When the whole source
fails a round, its known GPUs are reported down (``up=False``) rather than served stale.

**A hung call.** An NVML call can block in the driver for good, and an abandoned C call
cannot be interrupted: the poller keeps its one sampling thread (never a second one
beside a hung call, which would only queue behind the driver's lock) and watches it
from the reading side. A round still running ``deadline_s`` after it started makes
``snapshot()`` answer every known GPU down (reason ``poll_overdue``) and the source's
collector failed, ``unready()`` say why, and ``sample_age_s()`` keep growing. When the
call returns, the next completed round is served as usual.

Every ``process_interval_s`` (first in round 1, before the round is published) the
same thread lists the processes on the GPUs into ``processes``, the ``ProcessGpuMap``
that joins span pids to GPUs; a failed listing leaves the last map in place and does
not fail the round.

``on_devices`` is told the device list at ``start()`` and again, from the sampling
thread, whenever a round finds it changed (a GPU gone or back), so a reader such as the
span aggregator follows the list without asking for it.

``release()`` asks the thread to let go of the source between rounds (``Releasable``:
NVML's ``nvmlShutdown``) and to stop polling, every GPU then reading down with reason
``released``; ``acquire()`` takes it again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuscope.exporter.gpu.capabilities import CollectorRun, ReportsCollectorHealth
from gpuscope.exporter.gpu.processes import PROCESS_LIST_INTERVAL_S, ProcessGpuMap, ProcessJoin
from gpuscope.exporter.gpu.source import (
    DownReason,
    GpuDevice,
    GpuReading,
    GpuSource,
    Releasable,
    ReportsUnrecoverable,
)

log = logging.getLogger(__name__)

# The shortest poll deadline: a healthy round on 8 GPUs takes well under a second (the
# PCIe throughput fallback alone is 2 x 20 ms per GPU), the first one also lists the
# processes and allocates the GPM samples.
MIN_DEADLINE_S = 2.0
STOP_JOIN_S = 1.0  # how long stop() waits for the sampling thread, at most


def default_deadline(interval_s: float) -> float:
    """Two poll intervals, at least ``MIN_DEADLINE_S``."""
    return max(2 * interval_s, MIN_DEADLINE_S)


@dataclass(frozen=True)
class GpuSnapshot:
    """What the last poll round saw; ``round`` counts completed rounds (0: none yet)."""

    round: int
    devices: tuple[GpuDevice, ...]
    readings: tuple[GpuReading, ...]
    runs: tuple[CollectorRun, ...]


class GpuPoller:
    """Owns ``source`` once started: ``stop()`` joins the thread and closes the source.

    ``processes`` is the map to keep up to date (the one whose ``uuids_for_pid`` the
    span aggregator reads); without one the poller makes its own, so that its status
    is served either way. ``deadline_s`` (default: ``default_deadline(interval_s)``) is
    how long a round may run before its GPUs are reported down.
    """

    def __init__(
        self,
        source: GpuSource,
        interval_s: float,
        *,
        timer: Callable[[], float] = time.perf_counter,
        processes: ProcessGpuMap | None = None,
        process_interval_s: float = PROCESS_LIST_INTERVAL_S,
        deadline_s: float | None = None,
        on_devices: Callable[[Sequence[GpuDevice]], None] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"GPU poll interval must be positive, got {interval_s}")
        deadline_s = default_deadline(interval_s) if deadline_s is None else deadline_s
        if not deadline_s > 0:
            raise ValueError(f"GPU poll deadline must be positive, got {deadline_s}")
        self.source = source
        self.interval_s = interval_s
        self.deadline_s = deadline_s
        self._timer = timer
        self.processes = ProcessGpuMap() if processes is None else processes
        self.processes.unavailable(ProcessJoin.PENDING, "the first listing is not in yet")
        self._process_interval_s = process_interval_s
        self._processes_due: float | None = None  # None: list in the next round
        self._process_error = ""
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop, release or acquire asked
        self._round_done = threading.Condition()
        self._thread: threading.Thread | None = None
        self._snapshot = GpuSnapshot(0, tuple(source.devices()), (), ())
        self._round_started: float | None = None  # set while a round runs
        self._step = ""  # what the running round is doing: for the overdue reason
        self._sampled_at = timer()  # when the served readings were taken
        self._want_released = False
        self._released = False
        self._on_devices = on_devices
        self._clock_changes = ClockChanges()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("GpuPoller already started")
        if self._on_devices is not None:
            self._on_devices(self._snapshot.devices)
        self._thread = threading.Thread(target=self._run, name="gpuscope-gpu-poller", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = STOP_JOIN_S) -> None:
        """Stop polling and close the source, waiting at most ``timeout_s`` for the thread.

        A thread still in a call after that is left behind (a daemon thread: it does not
        hold the process up at exit), and the source is then *not* closed: nvmlShutdown
        from this thread would either wait on the lock the hung call holds, hanging the
        shutdown with it, or free the library state that call is still using.
        """
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning(
                    "the GPU poller is stuck in %s; exiting without closing %s",
                    self._step or "a call",
                    self.source.name,
                )
                return
        self.source.close()

    def devices(self) -> Sequence[GpuDevice]:
        return self._snapshot.devices

    def snapshot(self) -> GpuSnapshot:
        """The last round, or, while a round is overdue, every known GPU down."""
        snapshot = self._snapshot
        overdue = self.overdue()
        if overdue is None:
            return snapshot
        readings = tuple(
            GpuReading(
                d.index, d.uuid, up=False, down_reason=DownReason.POLL_OVERDUE, mig_device=_mig(d)
            )
            for d in snapshot.devices
        )
        runs = (CollectorRun(self.source.name, False, overdue),)
        return GpuSnapshot(snapshot.round, snapshot.devices, readings, runs)

    def overdue(self) -> float | None:
        """Seconds the running round has taken, if past its deadline; else None."""
        started = self._round_started
        if started is None:
            return None
        elapsed = self._timer() - started
        return elapsed if elapsed > self.deadline_s else None

    def sample_age_s(self) -> float:
        """Seconds since the served readings were taken (since start, before the first)."""
        return max(0.0, self._timer() - self._sampled_at)

    def unready(self) -> str | None:
        """Why the GPU side is not ready (for ``/readyz``), or None."""
        overdue = self.overdue()
        if overdue is not None:
            return (
                f"GPU poll round {self._snapshot.round + 1} stuck in {self._step} for "
                f"{overdue:.1f} s (deadline {self.deadline_s:g} s): a {self.source.name} "
                "call is not returning"
            )
        if self._released:
            return f"{self.source.name} released on request (SIGUSR1); SIGUSR2 takes it again"
        if self._snapshot.round < 1:
            return "first GPU poll pending"
        return None

    def unrecoverable(self) -> str | None:
        """Why only a restart can help (for ``/healthz``), or None."""
        source = self.source
        return source.unrecoverable() if isinstance(source, ReportsUnrecoverable) else None

    def release(self) -> None:
        """Ask the thread to let go of the source after its current round (returns at once)."""
        self._want_released = True
        self._wake.set()

    def acquire(self) -> None:
        """Ask the thread to take the source again and poll (returns at once)."""
        self._want_released = False
        self._wake.set()

    def wait_for_round(self, round_number: int, timeout_s: float) -> bool:
        """Block until at least ``round_number`` rounds completed (the tests wait on it)."""
        with self._round_done:
            return self._round_done.wait_for(
                lambda: self._snapshot.round >= round_number, timeout=timeout_s
            )

    def poll_once(self) -> GpuSnapshot:
        """One round: sample, time it, publish the new snapshot."""
        started = self._timer()
        self._round_started, self._step = started, f"{self.source.name} sample"
        try:
            return self._poll(started)
        finally:
            self._round_started = None

    def _poll(self, started: float) -> GpuSnapshot:
        previous = self._snapshot
        health: list[CollectorRun] = []
        try:
            readings = tuple(self.source.sample())
            devices = tuple(self.source.devices())
            if isinstance(self.source, ReportsCollectorHealth):
                health += self.source.collector_health()
            success = True
        except Exception as exc:  # a failing source is a metric, never a crash
            log.warning("GPU source %s failed: %s", self.source.name, exc)
            devices = previous.devices
            readings = _down(devices, DownReason.SOURCE_FAILED)
            health = []
            success = False
        readings = self._clock_changes.count(readings)
        runs = [CollectorRun(self.source.name, success, self._timer() - started), *health]
        self._step = "the process listing"
        self._list_processes()
        self._sampled_at = started
        return self._publish(GpuSnapshot(previous.round + 1, devices, readings, tuple(runs)))

    def _publish(self, snapshot: GpuSnapshot) -> GpuSnapshot:
        changed = snapshot.devices != self._snapshot.devices
        if changed and self._on_devices is not None:
            self._on_devices(snapshot.devices)  # before the round is seen as done
        with self._round_done:
            self._snapshot = snapshot
            self._round_done.notify_all()
        return snapshot

    def _list_processes(self) -> None:
        now = self._timer()
        if self._processes_due is not None and now < self._processes_due:
            return
        self._processes_due = now + self._process_interval_s
        try:
            self.processes.refresh(self.source)
        except Exception as exc:  # the last map stays: NVML may be restarting
            if str(exc) != self._process_error:  # once per distinct error, not every listing
                log.warning("listing the GPUs' processes failed: %s", exc)
            self._process_error = str(exc)
        else:
            self._process_error = ""

    def _run(self) -> None:
        next_due = self._timer()
        while not self._stop.is_set():
            if self._want_released != self._released:
                self._switch()
                next_due = self._timer()
            if self._released:
                self._wake.wait()
                self._wake.clear()
                continue
            self.poll_once()
            # fixed-rate schedule; a round that overran starts the next one at once
            next_due = max(next_due + self.interval_s, self._timer())
            self._wake.wait(max(0.0, next_due - self._timer()))
            self._wake.clear()

    def _switch(self) -> None:
        """Release or take the source again, between rounds (on this thread, never beside
        a running call)."""
        source = self.source
        if self._want_released:
            if isinstance(source, Releasable):
                source.release()
            self._released = True
            previous = self._snapshot
            readings = _down(previous.devices, DownReason.RELEASED)
            # no run while released: asked for, so no collector failure (and no alert)
            self._publish(GpuSnapshot(previous.round, previous.devices, readings, ()))
            log.info("GPU source %s released; SIGUSR2 takes it again", source.name)
            return
        self._released = False
        self._processes_due = None
        if isinstance(source, Releasable):
            try:
                source.acquire()
            except Exception as exc:  # the rounds retry it, and report it failed meanwhile
                log.warning("taking GPU source %s again failed: %s", source.name, exc)
        log.info("GPU source %s taken again", source.name)


def _down(devices: Sequence[GpuDevice], reason: str) -> tuple[GpuReading, ...]:
    return tuple(
        GpuReading(d.index, d.uuid, up=False, down_reason=reason, mig_device=_mig(d))
        for d in devices
    )


def _mig(device: GpuDevice) -> int | None:
    return None if device.mig is None else device.mig.device_index


class ClockChanges:
    """Counts, per GPU, the polls whose SM clock differs from the previous poll's: a
    clock that is not locked swings under bursty load (boost, power and thermal
    limits), which a scrape every few seconds can miss. Poller thread only."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._changes: dict[str, int] = {}

    def count(self, readings: Sequence[GpuReading]) -> tuple[GpuReading, ...]:
        counted = []
        for reading in readings:
            clock = reading.values.get("sm_clock_hz")
            if clock is None:
                counted.append(reading)
                continue
            last = self._last.get(reading.uuid)
            changes = self._changes.get(reading.uuid, 0) + (last is not None and clock != last)
            self._last[reading.uuid], self._changes[reading.uuid] = clock, changes
            counted.append(dataclasses.replace(reading, sm_clock_changes_total=changes))
        return tuple(counted)
