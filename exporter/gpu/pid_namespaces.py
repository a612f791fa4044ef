"""Where a GPU process sits: its pid inside its own pid namespace, its container and pod.

In Kubernetes an engine pod keeps its own pid namespace, so ``process.pid`` on its
spans is a pid of that namespace (often 1), while NVML lists host pids. An exporter in
the host's pid namespace (``hostPID``) can read, for each host pid, the line
``NSpid:`` of ``/proc/<pid>/status`` (the pid in every namespace from the one ``/proc``
was mounted in down to the process's own: host pid first, innermost last) and
``/proc/<pid>/cgroup``, whose path names the pod's uid and the container's id::

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope

(the systemd cgroup driver writes the uid with ``_`` for ``-``; the cgroupfs driver
writes ``/kubepods/burstable/pod<uid>/<id>``). Both files are readable by any user, so
the exporter needs no privilege beyond the host's pid namespace.

A sender names its namespace with OpenTelemetry's resource attributes ``container.id``
(the container resource detector reads it from the same cgroup) or ``k8s.pod.uid``
(the downward API's ``metadata.uid``, through ``OTEL_RESOURCE_ATTRIBUTES``); the pair
(that id, its pid) then names one process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# A pod's uid in a cgroup path: "pod" then a UUID, "-" (cgroupfs) or "_" (systemd).
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)
# A container's id: the last path element, 64 hex digits, with the runtime's prefix
# (containerd, CRI-O, Docker) and systemd's ".scope", or bare (cgroupfs driver).
_CONTAINER_ID = re.compile(
    r"/(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
_MAX_STATUS_BYTES = 16 * 1024  # a status file is about 1.5 KiB; never read an unbounded one
_MAX_CGROUP_BYTES = 16 * 1024


@dataclass(frozen=True)
class PidClaim:
    """What a span's resource says about the process that sent it.

    ``pid`` is in the sender's own pid namespace; ``container_id`` and ``pod_uid`` (when
    sent) say which namespace that is; ``authenticated``: whether the request carrying it
    passed the exporter's authentication (a bearer token or basic auth on /v1/traces).
    """

    pid: int
    container_id: str = ""
    pod_uid: str = ""
    authenticated: bool = False

    @property
    def namespaced(self) -> bool:
        """Whether the claim names the namespace its pid belongs to."""
        return bool(self.container_id or self.pod_uid)


@dataclass(frozen=True)
class Placement:
    """One host pid's place: its pids outermost first, and its container and pod."""

    ns_pids: tuple[int, ...]
    container_id: str = ""
    pod_uid: str = ""

    @property
    def nested(self) -> bool:
        """In a pid namespace below the one ``/proc`` shows (a container's own)."""
        return len(self.ns_pids) > 1

    @property
    def inner_pid(self) -> int:
        return self.ns_pids[-1]


def read_placement(proc: Path, pid: int) -> Placement:
    """``pid``'s place; a process whose files cannot be read is taken as not nested
    (a kernel before 4.1 has no ``NSpid:``: every pid is the host's there)."""
    ns_pids = read_ns_pids(proc, pid) or (pid,)
    container_id, pod_uid = read_cgroup_ids(proc, pid)
    return Placement(ns_pids, container_id, pod_uid)


def read_ns_pids(proc: Path, pid: int) -> tuple[int, ...] | None:
    """The ``NSpid:`` line of ``/proc/<pid>/status``, or None without one."""
    text = _read(proc / str(pid) / "status", _MAX_STATUS_BYTES)
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            try:
                pids = tuple(int(field) for field in line[len("NSpid:") :].split())
            except ValueError:
                return None
            return pids or None
    return None


def read_cgroup_ids(proc: Path, pid: int) -> tuple[str, str]:
    """``(container id, pod uid)`` from ``/proc/<pid>/cgroup``, each "" if not named.

    The unified (v2) line ``0::`` is read first; on cgroup v1 every controller's line
    names the same path, and the first that names an id is taken.
    """
    lines = _read(proc / str(pid) / "cgroup", _MAX_CGROUP_BYTES).splitlines()
    paths = [line.split(":", 2)[2] for line in lines if line.count(":") >= 2]
    paths.sort(key=lambda path: path == "/")  # stable: "/" (no cgroup) last
    unified = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    container_id = pod_uid = ""
    for path in unified + paths:
        if not container_id and (found := _CONTAINER_ID.search(path)):
            container_id = found.group(1)
        if not pod_uid and (uid := _POD_UID.search(path)):
            pod_uid = uid.group(1).replace("_", "-")
    return container_id, pod_uid


def normal_container_id(value: str) -> str:
    """A sender's ``container.id`` as the cgroup writes it (lower case, no prefix)."""
    value = value.strip().lower()
    for prefix in ("containerd://", "cri-o://", "docker://"):  # as a pod's status writes it
        value = value.removeprefix(prefix)
    return value


def _read(path: Path, limit: int) -> str:
    try:
        with path.open("rb") as file:
            return file.read(limit).decode("ascii", "replace")
    except OSError:  # gone, or not ours to read
        return ""
