"""XID errors from NVML event sets, counted per GPU and XID in a background thread.

Each GPU has an event set of its own: once a GPU registered in a set falls off the bus,
every later ``nvmlEventSetWait`` on that set answers GPU_IS_LOST, so one shared set would
stop the XIDs of every GPU. The one thread waits on each set in turn (events queue in a
set until it is waited on, so none is missed); a set that answers GPU_IS_LOST is freed
and its GPU left out until the source registers it again when it answers (``register``).

``nvmlEventSetWait`` blocks in the driver until an event or the timeout; a Timeout is
the normal idle case. pynvml's ``nvmlEventSetWait`` calls the C ``nvmlEventSetWait_v2``;
on a driver without it (FunctionNotFound) the watcher calls the C ``nvmlEventSetWait``,
which fills the first fields of the same struct (see ``_wait_v1``).

Counts live in ``XidCounts``, owned by the source, so they survive the watcher being
rebuilt after a driver re-initialisation: the counter never resets while the exporter
runs (unlike dcgm-exporter's last-value gauge). A failure that repeats is logged once,
then at most every ``WARNING_INTERVAL_S``.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuscope.exporter.gpu.capabilities import CollectorRun
from gpuscope.exporter.gpu.nvml.errors import NvmlErrorKind, classify

log = logging.getLogger(__name__)

COLLECTOR = "nvml_xid_events"
ERROR_PAUSE_S = 1.0  # after a failed round of waits, before waiting again
WARNING_INTERVAL_S = 60.0  # the same failure is logged at most this often
STOP_MARGIN_S = 1.0  # beyond one wait, how long stop() waits for the thread


class XidCounts:
    """Thread-safe uuid -> xid -> count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[int, int]] = {}

    def add(self, uuid: str, xid: int) -> None:
        with self._lock:
            per_gpu = self._counts.setdefault(uuid, {})
            per_gpu[xid] = per_gpu.get(xid, 0) + 1

    def of(self, uuid: str) -> dict[int, int]:
        with self._lock:
            return dict(self._counts.get(uuid, {}))


class ThrottledWarnings:
    """Logs a warning the first time a message is seen, then the same one at most every
    ``interval_s`` (at debug level in between): a failure that repeats every second
    must not fill the log."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = WARNING_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._interval_s, self._clock = logger, interval_s, clock
        self._last: dict[str, float] = {}

    def warn(self, message: str) -> None:
        now = self._clock()
        last = self._last.get(message)
        if last is not None and now - last < self._interval_s:
            self._log.debug("%s", message)
            return
        self._last[message] = now
        self._log.warning("%s", message)


def registration_refused(nvml: Any, exc: BaseException) -> str:
    """Why NVML will not watch a GPU's XIDs, in words ``gpuscope doctor`` prints."""
    if isinstance(exc, getattr(nvml, "NVMLError_NoPermission", ())):
        return (
            "needs privileges: NVML refused to register this GPU for XID events "
            "(NoPermission; with MIG enabled only root may); run the exporter as root to "
            "count its XIDs"
        )
    if isinstance(exc, getattr(nvml, "NVMLError_NotSupported", ())):
        return "XID events are not supported on this GPU (NotSupported)"
    return f"cannot register for XID events: {exc}"


class XidEventWatcher:
    """Registers each GPU for XID events in a set of its own and counts them until
    ``stop()``. ``register`` may be called from another thread (the poller's)."""

    def __init__(
        self,
        nvml: Any,
        handles: Mapping[str, Any],
        counts: XidCounts,
        *,
        wait_ms: int = 200,
        warnings: ThrottledWarnings | None = None,
    ) -> None:
        self._nvml = nvml
        self._counts = counts
        self._wait_ms = wait_ms
        self._warnings = warnings or ThrottledWarnings(log)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._sets: dict[str, Any] = {}  # uuid -> its event set
        self.unsupported: dict[str, str] = {}  # uuid -> why XIDs cannot be watched
        self._last = CollectorRun(COLLECTOR, True, 0.0)
        self._ever_watched = False
        self._wait: Callable[[Any, int], Any] = nvml.nvmlEventSetWait
        for uuid, handle in handles.items():
            self.register(uuid, handle)

    @property
    def watching(self) -> bool:
        return self._ever_watched

    def watched(self) -> set[str]:
        with self._lock:
            return set(self._sets)

    def register(self, uuid: str, handle: Any) -> bool:
        """Watch one GPU's XIDs in a new set: at start, and again after it was lost (a
        GPU that fell off the bus takes its registration with it). False if NVML refuses,
        with the reason in ``unsupported``."""
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self.unsupported[uuid] = f"cannot create an NVML event set: {exc}"
            return False
        try:
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        except nvml.NVMLError as exc:
            self.unsupported[uuid] = registration_refused(nvml, exc)
            self._free(event_set)
            return False
        self.unsupported.pop(uuid, None)
        with self._lock:
            previous = self._sets.pop(uuid, None)
            self._sets[uuid] = event_set
            self._ever_watched = True
        if previous is not None:
            self._free(previous)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuscope-xid-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop waiting and free the sets. Bounded: a wait hung in the driver is left to
        its daemon thread, and its sets are not freed under it."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(self._wait_ms / 1000 + STOP_MARGIN_S)
            if thread.is_alive():
                log.warning("the XID event thread is stuck in NVML; leaving it behind")
                return
        with self._lock:
            sets, self._sets = list(self._sets.values()), {}
        for event_set in sets:
            self._free(event_set)

    def health(self) -> CollectorRun | None:
        """The last round's outcome; its duration is the handling time, not the idle wait.
        None while no GPU was ever registered (nothing to watch)."""
        return self._last if self._ever_watched else None

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.wait_round():
                self._stop.wait(ERROR_PAUSE_S)

    def wait_round(self) -> bool:
        """One wait on each GPU's set (the thread loops on it); False when a wait failed.
        A GPU lost meanwhile is no failure of this collector: its set is dropped."""
        with self._lock:
            sets = list(self._sets.items())
        if not sets:
            self._stop.wait(self._wait_ms / 1000)
            return True
        timeout_ms = max(1, self._wait_ms // len(sets))
        handling = 0.0
        ok = True
        for uuid, event_set in sets:
            outcome = self._wait_once(uuid, event_set, timeout_ms)
            if outcome is None:
                ok = False
            else:
                handling += outcome
        self._last = CollectorRun(COLLECTOR, ok, handling)
        return ok

    def _wait_once(self, uuid: str, event_set: Any, timeout_ms: int) -> float | None:
        """Seconds spent handling what one wait returned; None when it failed."""
        nvml = self._nvml
        try:
            data = self._wait_or_fall_back(event_set, timeout_ms)
        except nvml.NVMLError_Timeout:
            return 0.0
        except nvml.NVMLError as exc:
            kind = classify(nvml, exc)
            if kind is NvmlErrorKind.GPU_LOST:
                self._drop(uuid, event_set, exc)
                return 0.0
            self._warnings.warn(f"waiting for NVML XID events failed ({kind.value}): {exc}")
            return None
        started = time.perf_counter()
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            # the set is this GPU's own: no need to name the device (XID 79, "fallen off
            # the bus", comes from a GPU that may no longer answer nvmlDeviceGetUUID)
            self._counts.add(uuid, int(data.eventData))
        return time.perf_counter() - started

    def _wait_or_fall_back(self, event_set: Any, timeout_ms: int) -> Any:
        nvml = self._nvml
        try:
            return self._wait(event_set, timeout_ms)
        except nvml.NVMLError_FunctionNotFound:
            if self._wait == self._wait_v1:
                raise
            log.info("this driver lacks nvmlEventSetWait_v2: waiting with nvmlEventSetWait")
            self._wait = self._wait_v1
            return self._wait(event_set, timeout_ms)

    def _wait_v1(self, event_set: Any, timeout_ms: int) -> Any:
        """The C ``nvmlEventSetWait`` (drivers before ``_v2``). pynvml has no wrapper of
        its own for it, so this takes the function as pynvml's wrappers do (its private
        ``_nvmlGetFunctionPointer``, present from 11.x to 13.x; a test names it). The v1
        struct is the first three fields of pynvml's ``c_nvmlEventData_t``."""
        nvml = self._nvml
        function = nvml._nvmlGetFunctionPointer("nvmlEventSetWait")
        data = nvml.c_nvmlEventData_t()
        code = function(event_set, ctypes.pointer(data), ctypes.c_uint(timeout_ms))
        if code != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(code)
        return data

    def _drop(self, uuid: str, event_set: Any, exc: BaseException) -> None:
        with self._lock:
            if self._sets.get(uuid) is event_set:
                del self._sets[uuid]
        self._free(event_set)
        self._warnings.warn(
            f"GPU {uuid}: its XID events answer '{exc}'; not watched until it answers again"
        )

    def _free(self, event_set: Any) -> None:
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except self._nvml.NVMLError as exc:
            log.debug("freeing an NVML event set failed: %s", exc)
