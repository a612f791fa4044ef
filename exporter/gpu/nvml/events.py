"""XID errors from NVML's event set, counted per GPU and XID in a background thread.

``nvmlEventSetWait`` blocks in the driver until an event or the timeout; a Timeout
is the normal idle case. Counts live in ``XidCounts``, owned by the source, so they
survive the watcher being rebuilt after a driver re-initialisation: the counter
never resets while the exporter runs (unlike dcgm-exporter's last-value gauge).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from gpuscope.exporter.gpu.capabilities import CollectorRun
from gpuscope.exporter.gpu.nvml.errors import NvmlErrorKind, classify

log = logging.getLogger(__name__)

COLLECTOR = "nvml_xid_events"
ERROR_PAUSE_S = 1.0  # after a failed wait, before waiting again


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


class XidEventWatcher:
    """Registers every GPU for XID events and counts them until ``stop()``."""

    def __init__(
        self,
        nvml: Any,
        handles: Mapping[str, Any],
        counts: XidCounts,
        *,
        wait_ms: int = 200,
    ) -> None:
        self._nvml = nvml
        self._counts = counts
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.unsupported: dict[str, str] = {}  # uuid -> why XIDs cannot be watched
        self._last = CollectorRun(COLLECTOR, True, 0.0)
        self._event_set = nvml.nvmlEventSetCreate()
        self._uuid_by_address: dict[int | None, str] = {}
        registered = [self.register(uuid, handle) for uuid, handle in handles.items()]
        self.watching = any(registered)

    def register(self, uuid: str, handle: Any) -> bool:
        """Watch one GPU's XIDs: at start, and again with its new handle after it was lost
        (a GPU that fell off the bus loses its registration with it). False if NVML refuses."""
        nvml = self._nvml
        try:
            nvml.nvmlDeviceRegisterEvents(
                handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
            )
        except nvml.NVMLError as exc:
            self.unsupported[uuid] = f"cannot register for XID events: {exc}"
            return False
        self.unsupported.pop(uuid, None)
        self._uuid_by_address[handle_address(handle)] = uuid
        return True

    def register_again(self, uuid: str, handle: Any) -> None:
        """After a lost GPU came back: register its new handle, and start waiting if this
        is the first GPU that can be watched."""
        if self.register(uuid, handle) and not self.watching:
            self.watching = True
            self.start()

    def start(self) -> None:
        if self.watching:
            self._thread = threading.Thread(
                target=self._run, name="gpuscope-xid-events", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._nvml.nvmlEventSetFree(self._event_set)
        except self._nvml.NVMLError as exc:
            log.debug("freeing the NVML event set failed: %s", exc)

    def health(self) -> CollectorRun | None:
        """The last wait's outcome; its duration is the handling time, not the idle wait."""
        return self._last if self.watching else None

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.wait_once():
                self._stop.wait(ERROR_PAUSE_S)

    def wait_once(self) -> bool:
        """One wait for events (the thread loops on it); False when the wait failed."""
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait(self._event_set, self._wait_ms)
        except nvml.NVMLError_Timeout:
            self._last = CollectorRun(COLLECTOR, True, 0.0)
            return True
        except nvml.NVMLError as exc:
            log.warning(
                "waiting for NVML XID events failed (%s): %s", classify(nvml, exc).value, exc
            )
            self._last = CollectorRun(COLLECTOR, False, 0.0)
            return False
        started = time.perf_counter()
        ok = self._record(data)
        self._last = CollectorRun(COLLECTOR, ok, time.perf_counter() - started)
        return True

    def _record(self, data: Any) -> bool:
        nvml = self._nvml
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return True
        # known handles first: XID 79 ("fallen off the bus") comes from a GPU that
        # may no longer answer nvmlDeviceGetUUID
        uuid = self._uuid_by_address.get(handle_address(data.device))
        if uuid is None:
            try:
                uuid = str(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError as exc:
                log.warning("XID %d from a GPU that cannot be named: %s", data.eventData, exc)
                return classify(nvml, exc) is NvmlErrorKind.GPU_LOST
        self._counts.add(uuid, int(data.eventData))
        return True


def handle_address(handle: Any) -> int | None:
    """The pointer value of an NVML device handle (a ctypes pointer), to compare handles."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None
    return address
