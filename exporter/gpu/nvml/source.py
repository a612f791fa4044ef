"""The NVML GPU source (``nvidia-ml-py``), with per-GPU loss and driver recovery.

The pynvml module is injected (default: ``import pynvml``), so tests pass a fake of
its surface and there is no package-level NVML state. A GPU that answers GpuIsLost
reports ``up=False`` while the others keep reporting; each later poll tries to get
its handle back by index, so it returns without a restart when the driver does.
A driver-wide error shuts NVML down and re-initialises it with exponential
backoff; until then ``sample()`` raises, which the poller counts as a failure.
``processes()`` lists each GPU's processes for the process join (``processes``).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuscope.exporter.gpu.capabilities import CollectorRun
from gpuscope.exporter.gpu.nvml.device import NvmlDeviceReader
from gpuscope.exporter.gpu.nvml.errors import (
    GpuLostError,
    NvmlDriverError,
    NvmlErrorKind,
    classify,
)
from gpuscope.exporter.gpu.nvml.events import XidCounts, XidEventWatcher
from gpuscope.exporter.gpu.nvml.processes import collect
from gpuscope.exporter.gpu.processes import ProcessListing
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading, GpuSourceKind

log = logging.getLogger(__name__)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used now (no library, no driver, driver error)."""


class Backoff:
    """Exponential delays: initial, 2x, 4x, ... capped at maximum; reset on success."""

    def __init__(self, initial_s: float = 1.0, maximum_s: float = 60.0) -> None:
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self._next = initial_s

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self.maximum_s, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self.initial_s


def load_pynvml() -> Any:
    return importlib.import_module("pynvml")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    name: str = GpuSourceKind.NVML

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff: Backoff | None = None,
        xid_wait_ms: int = 200,
    ) -> None:
        self._nvml = load_pynvml() if nvml is None else nvml
        self._clock = clock
        self._backoff = backoff or Backoff()
        self._xid_wait_ms = xid_wait_ms
        self._xids = XidCounts()
        self._readers: list[NvmlDeviceReader | None] = []  # None: lost
        self._devices: tuple[GpuDevice, ...] = ()
        self._watcher: XidEventWatcher | None = None
        self._retry_at: float | None = None  # set while NVML is down
        self.last_error = ""
        self._initialised = False
        self._start()  # an unusable NVML at start-up is the caller's to handle

    # --- GpuSource ---------------------------------------------------------------

    def devices(self) -> Sequence[GpuDevice]:
        return self._devices

    def sample(self) -> Sequence[GpuReading]:
        if self._retry_at is not None:
            self._retry_start(self._retry_at)
        now = self._clock()
        readings = []
        try:
            for position, device in enumerate(self._devices):
                readings.append(self._read(position, device, now))
        except NvmlDriverError as exc:
            self._go_down(str(exc))
            raise NvmlUnavailable(str(exc)) from exc
        return readings

    def close(self) -> None:
        self._shutdown()

    # --- extras: collector health, support ----------------------------------------

    def collector_health(self) -> Sequence[CollectorRun]:
        run = None if self._watcher is None else self._watcher.health()
        return [] if run is None else [run]

    def unsupported_metrics(self) -> Mapping[int, Mapping[str, str]]:
        report: dict[int, dict[str, str]] = {}
        for device, reader in zip(self._devices, self._readers, strict=True):
            reasons = dict(reader.unsupported) if reader is not None else {}
            watcher_reason = (
                None if self._watcher is None else self._watcher.unsupported.get(device.uuid)
            )
            if watcher_reason is not None:
                reasons["xid_errors"] = watcher_reason
            report[device.index] = reasons
        return report

    def processes(self) -> ProcessListing:
        """The processes on each GPU that answers (``ListsProcesses``; poller thread)."""
        if self._retry_at is not None:
            raise NvmlUnavailable(f"NVML is down ({self.last_error})")
        listers = [
            (device.uuid, reader.processes)
            for device, reader in zip(self._devices, self._readers, strict=True)
            if reader is not None
        ]
        try:
            return collect(listers)
        except NvmlDriverError as exc:
            # the next sample() meets the same error and restarts NVML with backoff
            raise NvmlUnavailable(str(exc)) from exc

    def notes(self) -> Mapping[int, Mapping[str, str]]:
        return {
            d.index: dict(r.notes) for d, r in zip(self._devices, self._readers, strict=True) if r
        }

    # --- internals ------------------------------------------------------------------

    def _read(self, position: int, device: GpuDevice, now: float) -> GpuReading:
        reader = self._readers[position] or self._recover(position, device)
        if reader is None:
            return GpuReading(index=device.index, uuid=device.uuid, up=False)
        try:
            return reader.read(now, self._xids.of(device.uuid), self._watches_xids(device.uuid))
        except GpuLostError as exc:
            log.warning("%s", exc)
            reader.close()
            self._readers[position] = None
            return GpuReading(index=device.index, uuid=device.uuid, up=False)

    def _watches_xids(self, uuid: str) -> bool:
        watcher = self._watcher
        return watcher is not None and uuid not in watcher.unsupported

    def _recover(self, position: int, device: GpuDevice) -> NvmlDeviceReader | None:
        """A lost GPU's handle again, if the same GPU answers at its index."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(device.index)
            if _text(nvml.nvmlDeviceGetUUID(handle)) != device.uuid:
                return None
            reader = NvmlDeviceReader(nvml, device, handle)
        except (nvml.NVMLError, GpuLostError):
            return None  # still gone; a driver-wide failure shows on the next read
        log.info("GPU %d (%s) is back", device.index, device.uuid)
        self._readers[position] = reader
        if self._watcher is not None:
            self._watcher.register_again(device.uuid, handle)
        return reader

    def _start(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        self._initialised = True
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            opened = [self._open(nvml, i, driver) for i in range(nvml.nvmlDeviceGetCount())]
            readers = [r for r in opened if r is not None]
            self._watcher = XidEventWatcher(
                nvml,
                {r.device.uuid: r.handle for r in readers},
                self._xids,
                wait_ms=self._xid_wait_ms,
            )
        except (nvml.NVMLError, NvmlDriverError) as exc:
            self._shutdown()
            raise NvmlUnavailable(f"NVML device discovery failed: {exc}") from exc
        self._readers = list(readers)
        self._devices = tuple(r.device for r in readers)
        self._watcher.start()
        self._retry_at = None
        self._backoff.reset()

    @staticmethod
    def _open(nvml: Any, index: int, driver: str) -> NvmlDeviceReader | None:
        """The reader of GPU ``index``; None (and a warning) if it is lost already."""
        try:
            return NvmlSource._open_reader(nvml, index, driver)
        except GpuLostError as exc:
            log.warning("GPU %d is lost at start-up; skipped until NVML restarts: %s", index, exc)
        except nvml.NVMLError as exc:
            if classify(nvml, exc) is not NvmlErrorKind.GPU_LOST:
                raise
            log.warning("GPU %d is lost at start-up; skipped until NVML restarts", index)
        return None

    @staticmethod
    def _open_reader(nvml: Any, index: int, driver: str) -> NvmlDeviceReader:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            numa: int | None = int(nvml.nvmlDeviceGetNumaNodeId(handle))
        except nvml.NVMLError:
            numa = None  # single-socket hosts and old drivers have none
        device = GpuDevice(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            numa_node=numa,
            driver_version=driver,
        )
        return NvmlDeviceReader(nvml, device, handle)

    def _retry_start(self, retry_at: float) -> None:
        now = self._clock()
        if now < retry_at:
            raise NvmlUnavailable(
                f"NVML is down ({self.last_error}); next retry in {retry_at - now:.1f} s"
            )
        try:
            self._start()
        except NvmlUnavailable as exc:
            self._go_down(str(exc))
            raise
        log.info("NVML re-initialised: %d GPUs", len(self._devices))

    def _go_down(self, error: str) -> None:
        self._shutdown()
        self.last_error = error
        self._retry_at = self._clock() + self._backoff.next_delay()
        log.warning("NVML failed (%s); retrying in %.1f s", error, self._retry_at - self._clock())

    def _shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        for reader in self._readers:
            if reader is not None:
                reader.close()
        self._readers = [None] * len(self._devices)
        if not self._initialised:
            return
        self._initialised = False
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)
