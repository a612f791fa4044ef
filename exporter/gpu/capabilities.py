"""Optional extras a GPU source may offer beyond the ``GpuSource`` protocol.

* ``ReportsCollectorHealth``: a source with helpers of its own (NVML's XID event
  thread) reports how each last ran, so every collector gets
  ``gpuscope_collector_success`` and ``gpuscope_collector_duration_seconds``.
* ``ExplainsSupport``: a source says why a metric is absent (driver, architecture,
  permission), which is what ``gpuscope doctor`` prints.
* ``ListsProcesses`` (in ``processes``, with the map it feeds): a source lists the
  processes running on each GPU, so that span pids join their GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class CollectorRun:
    """How one collector's most recent run went."""

    collector: str
    success: bool
    duration_s: float


@runtime_checkable
class ReportsCollectorHealth(Protocol):
    def collector_health(self) -> Sequence[CollectorRun]: ...


@runtime_checkable
class ExplainsSupport(Protocol):
    def unsupported_metrics(self) -> Mapping[int, Mapping[str, str]]:
        """GPU index -> metric group -> why the device does not give it."""
        ...
