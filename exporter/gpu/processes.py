"""Which GPUs a process holds, so that spans that name only their process join a GPU.

An engine's spans carry the id of the process that sent them (``process.pid`` from
``setup_tracing()``, vLLM's ``vllm.process_id``), but that process rarely holds the GPU
itself: vLLM's API server starts EngineCore, which starts one Worker per GPU, and only
those appear in NVML's list of a GPU's processes. So ``ProcessGpuMap`` maps each
process on a GPU *and each of its ancestors* (``/proc/<pid>/stat``, up to but not
including pid 1 and the exporter itself) to the sorted UUIDs of the GPUs held at or
below it: the API server of a tensor-parallel engine maps to all of its GPUs.

The poller thread rebuilds the map from a source's ``ProcessListing`` (``refresh``,
every ``PROCESS_LIST_INTERVAL_S``); the event loop reads it on every OTLP request
(``uuids_for_pid``). A rebuild publishes one new immutable object with a single
attribute store, so the reader takes no lock and makes no system call.

Where the join cannot work the status says why (``ProcessJoin``): no GPU source, a
source or driver that cannot list processes, no permission (MIG without root), or an
exporter in another pid namespace than the one NVML reports pids in (a container
without ``hostPID``), seen as NVML listing processes of which ``/proc`` has none.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

PROC = Path("/proc")
# Seconds between two listings: NVML's list is one driver call per GPU, but the walk
# up each process's parents reads several /proc files; 5 s is far shorter than an
# engine takes to load its model after it first touches the GPU.
PROCESS_LIST_INTERVAL_S = 5.0
MAX_DEPTH = 64  # a parent chain longer than this is a loop in a damaged /proc, not a tree

FALLBACK = (
    "requests whose spans carry no GPU UUID, and no pid joined here, are joined to this "
    "host's GPUs by the rules (per-host join)"
)


class ProcessJoin(StrEnum):
    """Whether span pids can be joined to GPUs here, and if not, why."""

    PENDING = "pending"  # the source can list processes; the first listing is not in yet
    OK = "ok"
    NO_PERMISSION = "no_permission"
    NOT_SUPPORTED = "not_supported"
    OTHER_PID_NAMESPACE = "other_pid_namespace"
    NO_GPU_SOURCE = "no_gpu_source"
    # NVML listed pids no process can have (a pynvml/driver record-size mismatch)
    UNTRUSTED_LISTING = "untrusted_listing"


@dataclass(frozen=True)
class RefusedListing:
    """Why one GPU's processes could not be listed."""

    status: ProcessJoin
    why: str


@dataclass(frozen=True)
class ProcessListing:
    """One listing of the processes on each GPU, keyed by GPU UUID.

    A GPU in neither mapping was not asked (lost, or the source skipped it this time).
    """

    pids: Mapping[str, tuple[int, ...]]  # uuid -> pids of its compute and graphics processes
    refused: Mapping[str, RefusedListing] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)  # uuid -> how it was listed, if unusual


class ProcessListUnavailable(Exception):
    """The source cannot list processes at all."""

    def __init__(self, status: ProcessJoin, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


@runtime_checkable
class ListsProcesses(Protocol):
    """A GPU source that can say which processes run on each of its GPUs."""

    def processes(self) -> ProcessListing:
        """Called from the poller thread only; may raise ``ProcessListUnavailable``."""
        ...


@dataclass(frozen=True)
class ProcessJoinState:
    """What the last listing gave, for ``gpuscope doctor`` and the self metrics."""

    status: ProcessJoin
    why: str
    listing: ProcessListing = ProcessListing({})
    visible: tuple[int, ...] = ()  # processes on a GPU that /proc shows here
    missing: tuple[int, ...] = ()  # processes on a GPU that /proc lacks (exited, or elsewhere)
    mapped: int = 0  # pids the map answers for: those processes and their ancestors


@dataclass(frozen=True)
class _Published:
    by_pid: Mapping[int, tuple[str, ...]]
    state: ProcessJoinState


class ProcessGpuMap:
    """pid -> GPU UUIDs held by that process or its descendants; see the module doc.

    ``proc_root`` and ``own_pid`` are for tests (a fake ``/proc`` tree in a temporary
    folder). Until a source is attached the status is ``no_gpu_source``.
    """

    def __init__(self, *, proc_root: Path = PROC, own_pid: int | None = None) -> None:
        self._proc = proc_root
        self._own_pid = os.getpid() if own_pid is None else own_pid
        self._published = _Published(
            {}, ProcessJoinState(ProcessJoin.NO_GPU_SOURCE, "no GPU source")
        )

    # --- the readers' side (the ingest thread) ----------------------------------------

    def uuids_for_pid(self, pid: int) -> tuple[str, ...]:
        """The sorted UUIDs of the GPUs that ``pid`` or its descendants hold; () if none."""
        return self._published.by_pid.get(pid, ())

    def state(self) -> ProcessJoinState:
        return self._published.state

    # --- the poller's side --------------------------------------------------------------

    def refresh(self, source: object) -> None:
        """List ``source``'s processes now and rebuild the map.

        A source that cannot list processes empties the map and says why; any other
        exception propagates and leaves the last map in place (a join a few seconds
        stale is better than none while NVML recovers).
        """
        if source is None:
            self.unavailable(ProcessJoin.NO_GPU_SOURCE, "no GPU source")
            return
        if not isinstance(source, ListsProcesses):
            name = getattr(source, "name", type(source).__name__)
            self.unavailable(
                ProcessJoin.NOT_SUPPORTED,
                f"the {name} GPU source cannot list the processes on its GPUs",
            )
            return
        try:
            listing = source.processes()
        except ProcessListUnavailable as exc:
            self.unavailable(exc.status, exc.why)
            return
        self.update(listing)

    def unavailable(self, status: ProcessJoin, why: str) -> None:
        """Empty the map: no pid can be joined, for the reason given."""
        self._published = _Published({}, ProcessJoinState(status, why))

    def update(self, listing: ProcessListing) -> None:
        """Rebuild the map from one listing (poller thread)."""
        holders: dict[int, set[str]] = {}
        for uuid, pids in listing.pids.items():
            for pid in pids:
                holders.setdefault(pid, set()).add(uuid)
        parents: dict[int, int | None] = {}  # one read per pid, however many GPUs share it
        below: dict[int, set[str]] = {}
        visible, missing = [], []
        for pid, uuids in sorted(holders.items()):
            lineage = self._lineage(pid, parents)
            if lineage is None:
                missing.append(pid)
                continue
            visible.append(pid)
            for member in lineage:
                below.setdefault(member, set()).update(uuids)
        by_pid = {pid: tuple(sorted(uuids)) for pid, uuids in below.items()}
        status, why = self._judge(listing, visible, missing)
        state = ProcessJoinState(
            status,
            why,
            listing,
            tuple(visible),
            tuple(missing),
            len(by_pid) if status is ProcessJoin.OK else 0,
        )
        self._published = _Published(by_pid if status is ProcessJoin.OK else {}, state)

    def _judge(
        self, listing: ProcessListing, visible: list[int], missing: list[int]
    ) -> tuple[ProcessJoin, str]:
        refused = "; ".join(f"{uuid}: {r.why}" for uuid, r in sorted(listing.refused.items()))
        if not self._proc.is_dir():
            return ProcessJoin.NOT_SUPPORTED, f"{self._proc} is not there to find parents in"
        if listing.refused and not listing.pids:
            statuses = {r.status for r in listing.refused.values()}
            # several reasons: no_permission first, as the one an operator can fix
            status = (
                ProcessJoin.NO_PERMISSION
                if ProcessJoin.NO_PERMISSION in statuses
                else sorted(statuses)[0]
            )
            return status, f"NVML does not list the GPUs' processes ({refused})"
        if missing and not visible:
            shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
            return ProcessJoin.OTHER_PID_NAMESPACE, (
                f"NVML lists pids {shown} on the GPUs, none of which is in {self._proc}: the "
                "exporter runs in another pid namespace than the driver reports pids in (a "
                "container without hostPID); run it in the host's (docker --pid=host, "
                "Kubernetes hostPID: true)"
            )
        why = f"{len(visible)} GPU processes seen in {self._proc}"
        if missing:
            why += f", {len(missing)} listed but gone (exited)"
        if refused:
            why += f"; not listed: {refused}"
        return ProcessJoin.OK, why

    def _lineage(self, pid: int, parents: dict[int, int | None]) -> list[int] | None:
        """``pid`` and its ancestors below pid 1 and the exporter; None if ``pid`` is not here."""
        parent = self._parent(pid, parents)
        if parent is None:
            return None
        lineage = [pid]
        while parent > 1 and parent != self._own_pid and parent not in lineage:
            if len(lineage) >= MAX_DEPTH:
                break
            lineage.append(parent)
            parent = self._parent(parent, parents)
            if parent is None:
                break  # it exited while we walked; its children are being re-parented
        return lineage

    def _parent(self, pid: int, cache: dict[int, int | None]) -> int | None:
        if pid in cache:
            return cache[pid]
        cache[pid] = parent = read_parent(self._proc, pid)
        return parent


def read_parent(proc: Path, pid: int) -> int | None:
    """The parent pid from ``/proc/<pid>/stat``, or None when there is no such process.

    The command name (field 2) is in parentheses and may itself hold spaces and
    parentheses, so the fields are counted from the last ``)``.
    """
    try:
        text = (proc / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:  # gone (ENOENT, or ESRCH while reading), or not ours to read
        return None
    try:
        return int(text.rpartition(")")[2].split()[1])  # after ")": state, ppid, ...
    except (IndexError, ValueError):
        return None
