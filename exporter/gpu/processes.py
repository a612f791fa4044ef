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

With ``hostPID`` in Kubernetes an engine pod keeps its own pid namespace, so its spans
name pids of that namespace. Each process in the map is therefore also placed
(``pid_namespaces``): one in a pid namespace of its own is found by its innermost pid
together with its container's id or its pod's uid, which the span's resource must send
(``container.id``, ``k8s.pod.uid``); a bare pid only ever matches a process of the
exporter's own pid namespace. Spans that name a bare pid while the GPUs' processes are
all namespaced cannot be mapped, and the status says so (``unmapped_pids``). A claim
from a sender the exporter did not authenticate is joined and counted as such, or
ignored with ``require_auth``: without authentication any sender can name any
process and be joined to its GPU.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from gpuscope.exporter.gpu.pid_namespaces import PidClaim, Placement, read_placement

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
    # GPU processes run in pid namespaces of their own and spans named bare pids
    UNMAPPED_PIDS = "unmapped_pids"


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
    nested: int = 0  # of the visible, those in a pid namespace of their own (a container's)
    claims: ClaimCounts = field(default_factory=lambda: ClaimCounts())  # since the last listing


@dataclass
class ClaimCounts:
    """Span resources' pid claims, counted by the ingest thread (its only writer)."""

    joined: int = 0  # joined to a GPU
    unmapped: int = 0  # a bare pid that matched nothing while GPU processes are namespaced
    unauthenticated: int = 0  # joined, from a sender that was not authenticated
    refused: int = 0  # not looked up: unauthenticated, and authentication is required

    def since(self, before: ClaimCounts) -> ClaimCounts:
        return ClaimCounts(
            self.joined - before.joined,
            self.unmapped - before.unmapped,
            self.unauthenticated - before.unauthenticated,
            self.refused - before.refused,
        )


@dataclass(frozen=True)
class _Published:
    by_pid: Mapping[int, tuple[str, ...]]  # processes of the exporter's pid namespace
    state: ProcessJoinState
    # (container id or pod uid, pid in its own namespace) -> GPUs; () where two
    # processes share the key (two containers of a pod, each with its pid 1)
    by_container: Mapping[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    by_pod: Mapping[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)


class ProcessGpuMap:
    """pid -> GPU UUIDs held by that process or its descendants; see the module doc.

    ``proc_root`` and ``own_pid`` are for tests (a fake ``/proc`` tree in a temporary
    folder). Until a source is attached the status is ``no_gpu_source``.
    ``require_auth``: join no claim from a sender that was not authenticated.
    """

    def __init__(
        self, *, proc_root: Path = PROC, own_pid: int | None = None, require_auth: bool = False
    ) -> None:
        self._proc = proc_root
        self._own_pid = os.getpid() if own_pid is None else own_pid
        self._require_auth = require_auth
        self._claims = ClaimCounts()  # written by the ingest thread only
        self._claims_seen = ClaimCounts()  # what the last listing's status saw (poller)
        self._published = _Published(
            {}, ProcessJoinState(ProcessJoin.NO_GPU_SOURCE, "no GPU source")
        )

    # --- the readers' side (the ingest thread) ----------------------------------------

    def uuids_for_pid(self, pid: int) -> tuple[str, ...]:
        """The sorted UUIDs of the GPUs that ``pid`` or its descendants hold; () if none.

        ``pid`` is one of the exporter's own pid namespace (not counted as a claim)."""
        return self._published.by_pid.get(pid, ())

    def uuids_for_claim(self, claim: PidClaim) -> tuple[str, ...]:
        """The GPUs of the process a span's resource names, as ``uuids_for_pid``; the
        claim is counted for the status (ingest thread only)."""
        counts = self._claims
        if not claim.authenticated and self._require_auth:
            counts.refused += 1
            return ()
        published = self._published
        if claim.namespaced:
            key = (claim.container_id, claim.pid)
            uuids = published.by_container.get(key, ()) or published.by_pod.get(
                (claim.pod_uid, claim.pid), ()
            )
        else:
            uuids = published.by_pid.get(claim.pid, ())
            if not uuids and published.state.nested:
                counts.unmapped += 1
        if uuids:
            counts.joined += 1
            if not claim.authenticated:
                counts.unauthenticated += 1
        return uuids

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
        placed = _Placed.of(self._proc, below, visible)
        status, why = self._judge(listing, visible, missing)
        claims = self._claims_since_last_listing()
        if status is ProcessJoin.OK:
            status, why = _judge_claims(why, placed, claims, self._require_auth)
        joins = status in (ProcessJoin.OK, ProcessJoin.UNMAPPED_PIDS)
        state = ProcessJoinState(
            status,
            why,
            listing,
            tuple(visible),
            tuple(missing),
            placed.mapped if joins else 0,
            placed.nested,
            claims,
        )
        if not joins:
            placed = _Placed()
        self._published = _Published(placed.by_pid, state, placed.by_container, placed.by_pod)

    def _claims_since_last_listing(self) -> ClaimCounts:
        now = dataclasses.replace(self._claims)  # a copy: the ingest thread goes on counting
        since = now.since(self._claims_seen)
        self._claims_seen = now
        return since

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


@dataclass
class _Placed:
    """The map's keys for one listing: host pids, and (id, pid) pairs of namespaces."""

    by_pid: dict[int, tuple[str, ...]] = field(default_factory=dict)
    by_container: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    by_pod: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    nested: int = 0  # GPU processes in a pid namespace of their own
    unnamed: int = 0  # ... whose cgroup names neither container nor pod

    @property
    def mapped(self) -> int:
        return len(self.by_pid) + len(self.by_container) + len(self.by_pod)

    @classmethod
    def of(cls, proc: Path, below: Mapping[int, set[str]], holders: list[int]) -> _Placed:
        """Each pid of ``below`` (GPU processes and their ancestors) under its keys."""
        placed = cls()
        owners: dict[tuple[str, str, int], int] = {}  # key -> the host pid that holds it
        held = set(holders)
        for pid, found in sorted(below.items()):
            uuids = tuple(sorted(found))
            where = read_placement(proc, pid)
            if not where.nested:
                placed.by_pid[pid] = uuids
                continue
            if pid in held:
                placed.nested += 1
                placed.unnamed += not (where.container_id or where.pod_uid)
            placed._add(
                owners, "container", placed.by_container, where.container_id, where, pid, uuids
            )
            placed._add(owners, "pod", placed.by_pod, where.pod_uid, where, pid, uuids)
        return placed

    @staticmethod
    def _add(
        owners: dict[tuple[str, str, int], int],
        kind: str,
        table: dict[tuple[str, int], tuple[str, ...]],
        name: str,
        where: Placement,
        pid: int,
        uuids: tuple[str, ...],
    ) -> None:
        if not name:
            return
        key = (name, where.inner_pid)
        owner = owners.setdefault((kind, *key), pid)
        table[key] = uuids if owner == pid else ()  # two processes, one key: neither


def _judge_claims(
    why: str, placed: _Placed, claims: ClaimCounts, require_auth: bool
) -> tuple[ProcessJoin, str]:
    """An ``ok`` listing, judged again by what the span resources claimed since the last."""
    status = ProcessJoin.OK
    if placed.nested:
        why += (
            f"; {placed.nested} of them in pid namespaces of their own (containers), joined "
            "by their pid there with container.id or k8s.pod.uid"
        )
    if placed.unnamed:
        why += f"; {placed.unnamed} of those in no container or pod cgroup: never joined"
    if claims.unmapped:
        status = ProcessJoin.UNMAPPED_PIDS
        why = (
            f"span pids are namespaced and no container id / pod was sent: "
            f"{claims.unmapped} span resources since the last listing named a pid without "
            "container.id or k8s.pod.uid, which the GPUs' processes in pid namespaces of "
            "their own need (set k8s.pod.uid from the downward API in "
            f"OTEL_RESOURCE_ATTRIBUTES); {claims.joined} were joined; {why}"
        )
    if claims.unauthenticated:
        why += (
            f"; {claims.unauthenticated} pid claims joined from unauthenticated senders "
            "(no authentication on /v1/traces): any sender can claim any process's GPU"
        )
    if claims.refused:
        why += f"; {claims.refused} pid claims from unauthenticated senders ignored"
    elif require_auth:
        why += "; pid claims are joined from authenticated senders only"
    return status, why


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
