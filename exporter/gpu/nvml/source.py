"""The NVML GPU source (``nvidia-ml-py``), with per-GPU loss and driver recovery.

The pynvml module is injected (default: ``import pynvml``), so tests pass a fake of
its surface and there is no package-level NVML state. A GPU that answers an error that
puts it down (GpuIsLost, ResetRequired, InsufficientPower, ..., see ``errors.ERRORS``)
reports ``up=False`` with that reason while the others keep reporting; each later poll
tries to get its handle back by index, so it returns without a restart when the driver
does, and is registered for XID events again. A GPU that cannot be opened at start
(its handle refused: NoPermission, InsufficientPower, IrqIssue, ...) is left out with
its reason (``unopened_gpus()``, which ``gpuscope doctor`` prints) until NVML is opened
again. A driver-wide error shuts NVML down and re-initialises it with exponential
backoff; until then ``sample()`` raises, which the poller counts as a failure; one that
cannot heal in this process (LibRmVersionMismatch) is also ``unrecoverable()``, which
fails liveness. ``release()`` / ``acquire()`` let go of NVML and take it again.
``processes()`` lists each GPU's processes for the process join (``processes``).

A GPU in MIG mode is served with each of its MIG instances as a GPU of its own
(``mig``): an instance's reader asks its MIG handle for what NVML gives per instance
(memory, processes), the parent's handle for its GPU instance's GPM
(``nvmlGpmMigSampleGet``, where the driver has it), and leaves the rest to the parent's
series. Its processes are
listed on the instance's handle (which NVML answers without root, where the parent's
aggregate list needs it), and the parent's list is then not used, so that a process
joins the one instance it runs on.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuscope.exporter.gpu.capabilities import CollectorRun
from gpuscope.exporter.gpu.numa import Affinity, from_mask, sysfs_affinity
from gpuscope.exporter.gpu.nvml.device import READERS, NvmlDeviceReader
from gpuscope.exporter.gpu.nvml.errors import (
    GpuLostError,
    NvmlDriverError,
    NvmlErrorKind,
    classify,
    down_reason,
    is_fatal,
)
from gpuscope.exporter.gpu.nvml.events import XidCounts, XidEventWatcher
from gpuscope.exporter.gpu.nvml.mig import mig_device, mig_handles
from gpuscope.exporter.gpu.nvml.processes import collect
from gpuscope.exporter.gpu.processes import ProcessListing
from gpuscope.exporter.gpu.source import DownReason, GpuDevice, GpuReading, GpuSourceKind

log = logging.getLogger(__name__)


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used now (no library, no driver, driver error)."""


class UnopenedGpu(Exception):
    """One GPU refused to be opened; the others are opened without it."""


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


def _numa_node(nvml: Any, handle: Any) -> int | None:
    """The GPU's NUMA node, where pynvml (12.550+) and the driver have the call."""
    get = getattr(nvml, "nvmlDeviceGetNumaNodeId", None)
    if get is None:
        return None  # nvidia-ml-py before 12.550
    try:
        return int(get(handle))
    except nvml.NVMLError:
        return None  # single-socket hosts and old drivers (FunctionNotFound) have none


CPU_WORDS = 16  # 1024 CPUs in NVML's 64-bit affinity words
NODE_WORDS = 1  # 64 NUMA nodes


def _affinity(nvml: Any, handle: Any, pci_bus_id: str) -> Affinity | None:
    """The GPU's CPUs (nvmlDeviceGetCpuAffinity) and nodes (nvmlDeviceGetMemoryAffinity,
    node scope); sysfs where NVML answers neither."""
    cpus: frozenset[int] = frozenset()
    nodes: frozenset[int] = frozenset()
    get_cpus = getattr(nvml, "nvmlDeviceGetCpuAffinity", None)
    get_nodes = getattr(nvml, "nvmlDeviceGetMemoryAffinity", None)
    try:
        if get_cpus is not None:
            cpus = from_mask(get_cpus(handle, CPU_WORDS))
    except nvml.NVMLError:
        pass  # NotSupported (a vGPU guest, ...): sysfs may know
    try:
        if get_nodes is not None:
            scope = getattr(nvml, "NVML_AFFINITY_SCOPE_NODE", 0)
            nodes = from_mask(get_nodes(handle, NODE_WORDS, scope))
    except nvml.NVMLError:
        pass
    if cpus or nodes:
        return Affinity(cpus, nodes)
    return sysfs_affinity(pci_bus_id)


def _answered(reading: GpuReading, reader: NvmlDeviceReader) -> bool:
    """Whether a GPU gave anything this round, or has nothing to give (all unsupported)."""
    if reading.values or reading.clock_event_reasons is not None:
        return True
    return reading.ecc_errors_total is not None or READERS.keys() <= reader.unsupported.keys()


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
        self._mig_parents: frozenset[str] = frozenset()  # uuids of GPUs with instances open
        self._mig_uuids: frozenset[str] = frozenset()  # uuids of those instances
        self._devices: tuple[GpuDevice, ...] = ()
        self._watcher: XidEventWatcher | None = None
        self._retry_at: float | None = None  # set while NVML is down
        self.last_error = ""
        self._fatal = ""  # set while the last failure cannot heal in this process
        self._unopened: dict[int, str] = {}  # GPU index -> why it could not be opened
        self._down: dict[str, str] = {}  # uuid -> reason, for GPUs that are down now
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
            self._go_down(str(exc), fatal=is_fatal(self._nvml, exc))
            raise NvmlUnavailable(str(exc)) from exc
        return readings

    def close(self) -> None:
        self._shutdown()

    # --- Releasable, ReportsUnrecoverable -------------------------------------------

    def release(self) -> None:
        """Let go of NVML (``nvmlShutdown``): the XID thread stops, handles are dropped;
        the devices and the XID counts are kept for ``acquire``."""
        self._shutdown()
        self._retry_at = None

    def acquire(self) -> None:
        """Open NVML again; on failure, ``sample()`` retries with backoff."""
        try:
            self._start()
        except NvmlUnavailable as exc:
            self._go_down(str(exc), fatal=is_fatal(self._nvml, exc))
            raise

    def unrecoverable(self) -> str | None:
        if not self._fatal:
            return None
        return (
            f"NVML cannot recover in this process ({self._fatal}): the NVIDIA driver was "
            "probably upgraded under it; restart the exporter"
        )

    def unopened_gpus(self) -> Mapping[int, str]:
        """GPU index -> why it could not be opened (it has no device, no series)."""
        return dict(self._unopened)

    # --- extras: collector health, support ----------------------------------------

    def collector_health(self) -> Sequence[CollectorRun]:
        run = None if self._watcher is None else self._watcher.health()
        return [] if run is None else [run]

    def unsupported_metrics(self) -> Mapping[int, Mapping[str, str]]:
        report: dict[int, dict[str, str]] = {}
        for device, reader in zip(self._devices, self._readers, strict=True):
            if device.mig is not None:
                continue  # keyed by uuid in mig_support(): an instance shares its index
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
            if reader is not None and device.uuid not in self._mig_parents
        ]
        try:
            return collect(listers)
        except NvmlDriverError as exc:
            # the next sample() meets the same error and restarts NVML with backoff
            raise NvmlUnavailable(str(exc)) from exc

    def notes(self) -> Mapping[int, Mapping[str, str]]:
        return {
            d.index: dict(r.notes)
            for d, r in zip(self._devices, self._readers, strict=True)
            if r and d.mig is None
        }

    def mig_support(self) -> Mapping[str, tuple[Mapping[str, str], Mapping[str, str]]]:
        """MIG instance uuid -> (metric group -> why absent, group -> note)."""
        return {
            d.uuid: (dict(r.unsupported), dict(r.notes))
            for d, r in zip(self._devices, self._readers, strict=True)
            if r and d.mig is not None
        }

    # --- internals ------------------------------------------------------------------

    def _read(self, position: int, device: GpuDevice, now: float) -> GpuReading:
        reader = self._readers[position] or self._recover(position, device)
        if reader is None:
            return self._down_reading(device, self._down.get(device.uuid, DownReason.LOST))
        try:
            reading = reader.read(now, self._xids.of(device.uuid), self._watches_xids(device.uuid))
        except GpuLostError as exc:
            reader.close()
            self._readers[position] = None
            return self._mark_down(device, down_reason(self._nvml, exc.__cause__), str(exc))
        if not _answered(reading, reader):
            # every group it gives failed (UNKNOWN to all, ...): nothing to serve
            return self._mark_down(device, DownReason.UNANSWERED, "no metric answered")
        if self._down.pop(device.uuid, None) is not None:
            log.info("GPU %s (%s) is back", device.label, device.uuid)
            self._watch_again(device.uuid, reader)
        return reading

    def _down_reading(self, device: GpuDevice, reason: str) -> GpuReading:
        mig = None if device.mig is None else device.mig.device_index
        return GpuReading(
            index=device.index, uuid=device.uuid, up=False, down_reason=reason, mig_device=mig
        )

    def _mark_down(self, device: GpuDevice, reason: str, detail: str) -> GpuReading:
        if self._down.get(device.uuid) != reason:  # once per change, not every poll
            log.warning("GPU %s (%s) is down (%s): %s", device.label, device.uuid, reason, detail)
        self._down[device.uuid] = reason
        return self._down_reading(device, reason)

    def _watches_xids(self, uuid: str) -> bool:
        watcher = self._watcher
        if uuid in self._mig_uuids:
            return False  # a MIG instance: XIDs are registered on its parent
        return watcher is not None and uuid not in watcher.unsupported

    def _watch_again(self, uuid: str, reader: NvmlDeviceReader) -> None:
        """A GPU that was down answers again: a set of its own for its XIDs (its old
        registration went with it, and a set it was in answers GPU_IS_LOST for good)."""
        if self._watcher is not None:
            self._watcher.register(uuid, reader.handle)

    def _recover(self, position: int, device: GpuDevice) -> NvmlDeviceReader | None:
        """A down GPU's handle again, if the same GPU answers at its index."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(device.index)
            parent = None
            if device.mig is not None:
                parent = self._parent_reader(device.mig.parent_uuid)
                if parent is None:
                    return None  # the parent first
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, device.mig.device_index)
            if _text(nvml.nvmlDeviceGetUUID(handle)) != device.uuid:
                return None
            reader = NvmlDeviceReader(nvml, device, handle, parent=parent)
        except (nvml.NVMLError, GpuLostError):
            return None  # still gone; a driver-wide failure shows on the next read
        self._readers[position] = reader
        return reader

    def _start(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        self._initialised = True
        self._unopened = {}
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            opened = [self._open(i, driver) for i in range(nvml.nvmlDeviceGetCount())]
            readers: list[NvmlDeviceReader] = []
            for reader in opened:
                if reader is not None:
                    readers += [reader, *self._open_instances(reader)]
        except (nvml.NVMLError, NvmlDriverError) as exc:
            self._shutdown()
            raise NvmlUnavailable(f"NVML device discovery failed: {exc}") from exc
        self._mig_parents = frozenset(r.device.mig.parent_uuid for r in readers if r.device.mig)
        self._mig_uuids = frozenset(r.device.uuid for r in readers if r.device.mig)
        # per GPU: a set NVML will not create or register costs that GPU's XIDs only; a
        # MIG instance's XIDs are its parent's
        self._watcher = XidEventWatcher(
            nvml,
            {r.device.uuid: r.handle for r in readers if r.device.mig is None},
            self._xids,
            wait_ms=self._xid_wait_ms,
        )
        self._readers = list(readers)
        self._devices = tuple(r.device for r in readers)
        self._down = {}
        self._watcher.start()
        self._retry_at = None
        self._fatal = ""
        self._backoff.reset()

    def _open(self, index: int, driver: str) -> NvmlDeviceReader | None:
        """The reader of GPU ``index``; None (with its reason in ``unopened_gpus()`` and a
        warning) if that GPU refuses: only a driver-wide error fails the whole source."""
        nvml = self._nvml
        try:
            return self._open_reader(nvml, index, driver)
        except GpuLostError as exc:
            why = f"{down_reason(nvml, exc.__cause__)}: {exc}"
        except nvml.NVMLError as exc:
            if classify(nvml, exc) is NvmlErrorKind.DRIVER:
                raise
            why = f"NVML refused to open it: {exc}"
        log.warning("GPU %d is left out until NVML is opened again (%s)", index, why)
        self._unopened[index] = why
        return None

    def _open_instances(self, parent: NvmlDeviceReader) -> list[NvmlDeviceReader]:
        """The readers of a MIG GPU's instances ([] outside MIG mode); an instance that
        refuses is left out with a warning, a driver-wide error fails the source."""
        nvml = self._nvml
        try:
            slots = mig_handles(nvml, parent.handle)
        except nvml.NVMLError as exc:
            if classify(nvml, exc) is NvmlErrorKind.DRIVER:
                raise
            log.warning("GPU %d: its MIG instances cannot be listed (%s)", parent.device.index, exc)
            return []
        readers = []
        for slot, handle in slots:
            try:
                device = mig_device(nvml, parent.device, handle, slot)
            except nvml.NVMLError as exc:
                if classify(nvml, exc) is NvmlErrorKind.DRIVER:
                    raise
                log.warning("GPU %d MIG device %d is left out (%s)", parent.device.index, slot, exc)
                continue
            readers.append(NvmlDeviceReader(nvml, device, handle, parent=parent))
        return readers

    def _parent_reader(self, uuid: str) -> NvmlDeviceReader | None:
        for device, reader in zip(self._devices, self._readers, strict=True):
            if device.uuid == uuid:
                return reader
        return None

    @staticmethod
    def _open_reader(nvml: Any, index: int, driver: str) -> NvmlDeviceReader:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        device = GpuDevice(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            pci_bus_id=bus_id,
            numa_node=_numa_node(nvml, handle),
            driver_version=driver,
            affinity=_affinity(nvml, handle, bus_id),
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
            self._go_down(str(exc), fatal=is_fatal(self._nvml, exc))
            raise
        log.info("NVML re-initialised: %d GPUs", len(self._devices))

    def _go_down(self, error: str, *, fatal: bool = False) -> None:
        self._shutdown()
        self.last_error = error
        self._fatal = error if fatal else ""
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
