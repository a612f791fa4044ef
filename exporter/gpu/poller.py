"""Samples a GPU source in one background thread and keeps the latest snapshot.

A scrape reads ``snapshot()``: one attribute load of an immutable object, so it
never waits on NVML, however slow a sample is. When the whole source fails a
round, its known GPUs are reported down (``up=False``) rather than served stale.

Every ``process_interval_s`` (first in round 1, before the round is published) the
same thread lists the processes on the GPUs into ``processes``, the ``ProcessGpuMap``
that joins span pids to GPUs; a failed listing leaves the last map in place and does
not fail the round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuscope.exporter.gpu.capabilities import CollectorRun, ReportsCollectorHealth
from gpuscope.exporter.gpu.processes import PROCESS_LIST_INTERVAL_S, ProcessGpuMap, ProcessJoin
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading, GpuSource

log = logging.getLogger(__name__)


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
    is served either way.
    """

    def __init__(
        self,
        source: GpuSource,
        interval_s: float,
        *,
        timer: Callable[[], float] = time.perf_counter,
        processes: ProcessGpuMap | None = None,
        process_interval_s: float = PROCESS_LIST_INTERVAL_S,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"GPU poll interval must be positive, got {interval_s}")
        self.source = source
        self.interval_s = interval_s
        self._timer = timer
        self.processes = ProcessGpuMap() if processes is None else processes
        self.processes.unavailable(ProcessJoin.PENDING, "the first listing is not in yet")
        self._process_interval_s = process_interval_s
        self._processes_due: float | None = None  # None: list in the next round
        self._process_error = ""
        self._stop = threading.Event()
        self._round_done = threading.Condition()
        self._thread: threading.Thread | None = None
        self._snapshot = GpuSnapshot(0, tuple(source.devices()), (), ())

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("GpuPoller already started")
        self._thread = threading.Thread(target=self._run, name="gpuscope-gpu-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.source.close()

    def devices(self) -> Sequence[GpuDevice]:
        return self._snapshot.devices

    def snapshot(self) -> GpuSnapshot:
        return self._snapshot

    def wait_for_round(self, round_number: int, timeout_s: float) -> bool:
        """Block until at least ``round_number`` rounds completed (the tests wait on it)."""
        with self._round_done:
            return self._round_done.wait_for(
                lambda: self._snapshot.round >= round_number, timeout=timeout_s
            )

    def poll_once(self) -> GpuSnapshot:
        """One round: sample, time it, publish the new snapshot."""
        started = self._timer()
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
            readings = tuple(GpuReading(index=d.index, uuid=d.uuid, up=False) for d in devices)
            health = []
            success = False
        runs = [CollectorRun(self.source.name, success, self._timer() - started), *health]
        self._list_processes()
        snapshot = GpuSnapshot(previous.round + 1, devices, readings, tuple(runs))
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
            self.poll_once()
            # fixed-rate schedule; a round that overran starts the next one at once
            next_due = max(next_due + self.interval_s, self._timer())
            self._stop.wait(max(0.0, next_due - self._timer()))
