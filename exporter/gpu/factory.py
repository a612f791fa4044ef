"""The GPU sources, in one registry, and ``open_gpu_source`` for ``--gpu-source``.

``HARDWARE_SOURCES`` lists every source that reads real GPUs, in the order
``--gpu-source auto`` tries them: the exporter, ``gpuscope doctor`` and
``scripts/gpu-check`` (through the doctor) all open sources here. The simulated
source takes its GPU count and scenario from flags; ``none`` opens nothing.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

from gpuscope.exporter.gpu.dcgm import DcgmSource, DcgmUnavailable
from gpuscope.exporter.gpu.nvml.source import NvmlSource, NvmlUnavailable
from gpuscope.exporter.gpu.scenario import load_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.gpu.source import GpuSource, GpuSourceKind

log = logging.getLogger(__name__)


class GpuSourceUnavailable(RuntimeError):
    """The GPU source asked for explicitly cannot be opened; the message names the flag."""


@dataclass(frozen=True)
class HardwareSource:
    """A source of real GPUs: how to open it, and the error that says it cannot be."""

    kind: GpuSourceKind
    open: Callable[[], GpuSource]
    unavailable: type[Exception]


# In the order ``--gpu-source auto`` tries them.
HARDWARE_SOURCES: tuple[HardwareSource, ...] = (
    HardwareSource(GpuSourceKind.DCGM, DcgmSource, DcgmUnavailable),
    HardwareSource(GpuSourceKind.NVML, NvmlSource, NvmlUnavailable),
)


def open_gpu_source(
    kind: GpuSourceKind, *, scenario: pathlib.Path | None, simulated_count: int
) -> GpuSource | None:
    """The source for ``kind``; ``auto`` tries ``HARDWARE_SOURCES`` in turn and settles
    for None.

    Raises ``ValueError`` for bad flag values (the GPU count is checked with the other
    flags, and again by ``SimulatedSource``) and ``GpuSourceUnavailable`` when an
    explicitly chosen source cannot be opened.
    """
    if kind not in tuple(GpuSourceKind):
        raise ValueError(f"--gpu-source must be one of {', '.join(GpuSourceKind)}; got {kind!r}")
    if scenario is not None and kind != GpuSourceKind.SIMULATED:
        raise ValueError(
            f"--gpu-scenario applies to --gpu-source simulated only, not {str(kind)!r}"
        )
    if kind == GpuSourceKind.NONE:
        return None
    if kind == GpuSourceKind.SIMULATED:
        return open_simulated_source(simulated_count, scenario)
    if kind == GpuSourceKind.AUTO:
        return _auto()
    (entry,) = (entry for entry in HARDWARE_SOURCES if entry.kind == kind)
    try:
        return entry.open()
    except entry.unavailable as exc:
        raise GpuSourceUnavailable(f"--gpu-source {kind}: {exc}") from exc


def open_simulated_source(count: int, scenario: pathlib.Path | None) -> SimulatedSource:
    """``count`` simulated GPUs following the scenario file, if one is given."""
    loaded = None if scenario is None else load_scenario(scenario)
    try:
        return SimulatedSource(count, loaded)
    except ValueError as exc:
        if loaded is None:
            raise
        raise ValueError(f"--gpu-scenario {scenario}: {exc}") from exc


def _auto() -> GpuSource | None:
    reasons = []
    for entry in HARDWARE_SOURCES:
        try:
            source = entry.open()
        except entry.unavailable as exc:
            reasons.append(str(exc))
            continue
        log.info("--gpu-source auto: using %s", source.name)
        return source
    log.warning(
        "--gpu-source auto: no GPU source (%s); serving request metrics only", "; ".join(reasons)
    )
    return None
