"""The processes running on a GPU, through NVML, for the process join (``processes``).

pynvml offers each list in versions: ``nvmlDeviceGetComputeRunningProcesses_v3``,
``_v2`` and the unversioned name, which maps to the newest and raises
``NVMLLibraryMismatchError`` when the driver's library lacks that version. The first
version the driver has is kept. A GPU that refuses (NoPermission: MIG without root;
NotSupported: some vGPU guests) is remembered with the reason and not asked again,
as the metric groups of ``device`` are.

A list holding a pid no process can have (0, 0xFFFFFFFF, above the kernel's
``pid_max``) is not used: it is what pynvml reads when its process record and the
driver's differ in size (a ``_v3`` call that writes 32-byte records read as 24-byte
ones gives 0 and 4294967295 from the second record on), and the real pids in it cannot
be told from the garbage. That GPU is then ``untrusted_listing`` for that listing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpuscope.exporter.gpu.nvml.errors import (
    GpuLostError,
    NvmlDriverError,
    NvmlErrorKind,
    classify,
    unsupported_reason,
)
from gpuscope.exporter.gpu.nvml.mig import mig_enabled
from gpuscope.exporter.gpu.processes import (
    ProcessJoin,
    ProcessListing,
    RefusedListing,
)

PID_MAX_FILE = Path("/proc/sys/kernel/pid_max")
PID_MAX_LIMIT = 4_194_304  # the kernel's PID_MAX_LIMIT on 64-bit: no pid is ever above it

COMPUTE = "nvmlDeviceGetComputeRunningProcesses"
GRAPHICS = "nvmlDeviceGetGraphicsRunningProcesses"
MPS = "nvmlDeviceGetMPSComputeRunningProcesses"  # the clients of an MPS server on the GPU
VERSIONS = ("_v3", "_v2", "")
MIG_NOTE = (
    "MIG mode, with no MIG instance open: the processes of every instance are joined to "
    "the whole GPU"
)


class _Refused(Exception):
    def __init__(self, refused: RefusedListing) -> None:
        super().__init__(refused.why)
        self.refused = refused


class _Transient(Exception):
    """A one-off failure: keep the last list this round."""


class DeviceProcessLister:
    """One GPU's running processes; used from the poller thread only."""

    def __init__(
        self, nvml: Any, handle: Any, *, device: str, driver: str, pid_max: int | None = None
    ) -> None:
        self._nvml = nvml
        self._pid_max = read_pid_max() if pid_max is None else pid_max
        self.untrusted: RefusedListing | None = None  # the last listing's, if it had bad pids
        self._handle = handle
        self._device = device
        self._driver = driver
        self.refused: RefusedListing | None = None
        self.note: str | None = None
        self._mig: bool | None = None  # asked on first use, so that opening costs nothing
        self._graphics = True  # False once the GPU refused the graphics list
        self._candidates = {
            kind: [kind + v for v in VERSIONS if hasattr(nvml, kind + v)]
            for kind in (COMPUTE, GRAPHICS, MPS)
        }
        self._last: tuple[int, ...] = ()
        # of the last listing: compute pid -> its device memory (None: NVML gave none), and
        # how many processes use the GPU through MPS (None: NVML cannot say)
        self.memory: dict[int, float | None] | None = None
        self.mps: int | None = None

    def pids(self) -> tuple[int, ...] | None:
        """Sorted pids on the GPU; None once it refused (see ``refused``).

        Raises ``GpuLostError`` and ``NvmlDriverError`` like the metric readers do.
        """
        self.untrusted = None
        if self.refused is not None:
            return None
        if self._mig is None:
            self._mig = mig_enabled(self._nvml, self._handle)
            self.note = MIG_NOTE if self._mig else None
        try:
            compute = self._list(COMPUTE)
            pids = {pid for pid, _ in compute}
            if self._graphics:
                try:
                    pids.update(pid for pid, _ in self._list(GRAPHICS))
                except _Refused:
                    # compute is what inference engines use; most datacenter GPUs
                    # have no graphics list to give
                    self._graphics = False
        except _Refused as exc:
            self.refused = exc.refused
            self.memory = None
            return None
        except _Transient:
            return self._last
        impossible = sorted(p for p in pids if not 0 < p <= self._pid_max)
        if impossible:
            shown = ", ".join(map(str, impossible[:3]))
            self.untrusted = RefusedListing(
                ProcessJoin.UNTRUSTED_LISTING,
                f"NVML listed impossible pids ({shown}; pid_max is {self._pid_max}): the "
                "process record this pynvml reads differs in size from the one this driver "
                f"({self._driver}) writes, so no pid of the list can be trusted; install the "
                "nvidia-ml-py release that matches the driver",
            )
            self.memory = None
            return None
        self.memory = dict(compute)
        self.mps = self._mps_clients()
        self._last = tuple(sorted(pids))
        return self._last

    def _mps_clients(self) -> int | None:
        """How many processes use the GPU through an MPS server; None where NVML cannot
        say (then not asked again)."""
        try:
            return len(self._list(MPS))
        except _Refused:
            self._candidates[MPS] = []
            return None
        except _Transient:
            return self.mps

    def _list(self, kind: str) -> list[tuple[int, float | None]]:
        """(pid, device memory in bytes, None where NVML has none) of each process."""
        nvml = self._nvml
        candidates = self._candidates[kind]
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", ())
        while candidates:
            try:
                return [
                    (int(p.pid), None if p.usedGpuMemory is None else float(p.usedGpuMemory))
                    for p in getattr(nvml, candidates[0])(self._handle)
                ]
            except mismatch:
                candidates.pop(0)  # the unversioned name's version is missing: no older left
            except nvml.NVMLError as exc:
                if isinstance(exc, getattr(nvml, "NVMLError_FunctionNotFound", ())):
                    candidates.pop(0)  # this driver predates this version: try the next
                    continue
                self._fail(exc)
        raise _Refused(
            RefusedListing(
                ProcessJoin.NOT_SUPPORTED,
                f"driver {self._driver}: its NVML library has no {kind} function",
            )
        )

    def _fail(self, exc: BaseException) -> NoReturn:
        nvml = self._nvml
        kind = classify(nvml, exc)
        if kind is NvmlErrorKind.GPU_LOST:
            raise GpuLostError(f"{self._device} is lost") from exc
        if kind is NvmlErrorKind.DRIVER:
            raise NvmlDriverError(f"NVML failed listing {self._device}'s processes: {exc}") from exc
        if kind is not NvmlErrorKind.UNSUPPORTED:
            raise _Transient(str(exc)) from exc
        why = unsupported_reason(nvml, exc, device=self._device, driver=self._driver)
        no_permission = isinstance(exc, getattr(nvml, "NVMLError_NoPermission", ()))
        if no_permission and self._mig:
            why = "MIG mode: NVML lists the processes of a MIG GPU's instances only to root"
        status = ProcessJoin.NO_PERMISSION if no_permission else ProcessJoin.NOT_SUPPORTED
        raise _Refused(RefusedListing(status, why)) from exc


def read_pid_max(path: Path = PID_MAX_FILE) -> int:
    """The kernel's largest pid; PID_MAX_LIMIT where the file cannot be read."""
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def collect(listers: Sequence[tuple[str, DeviceProcessLister]]) -> ProcessListing:
    """One listing over ``(uuid, lister)`` pairs; a lost GPU is left out, not refused."""
    pids: dict[str, tuple[int, ...]] = {}
    refused: dict[str, RefusedListing] = {}
    notes: dict[str, str] = {}
    for uuid, lister in listers:
        try:
            listed = lister.pids()
        except GpuLostError:
            continue  # the next sample reports it down
        why_not = lister.refused or lister.untrusted
        if listed is not None:
            pids[uuid] = listed
        elif why_not is not None:
            refused[uuid] = why_not
        if lister.note is not None:
            notes[uuid] = lister.note
    return ProcessListing(pids, refused, notes)
