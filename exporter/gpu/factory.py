"""The GPU sources, in one registry, and ``open_gpu_source`` for ``--gpu-source``.

``HARDWARE_SOURCES`` lists every source that reads real GPUs, in the order
``--gpu-source auto`` tries them: the exporter, ``gpuscope doctor`` and
``scripts/gpu-check`` (through the doctor) all open sources here. The simulated
source takes its GPU count and scenario from flags; ``none`` opens nothing. With
``require`` (``--require-gpu``), ending with no GPU is an error instead of a warning.

``RETIRED`` holds the values of ``--gpu-source`` that no longer open anything, each
with the message that says what to use instead (DCGM: dcgm-exporter's series).
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

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
    HardwareSource(GpuSourceKind.NVML, NvmlSource, NvmlUnavailable),
)

RETIRED: dict[GpuSourceKind, str] = {
    GpuSourceKind.DCGM: (
        "--gpu-source dcgm was retired: gpuscope reads the GPUs through NVML (--gpu-source "
        "nvml or auto); where DCGM runs, use NVIDIA's dcgm-exporter beside gpuscope "
        "(docs/gpu.md, 'DCGM: through dcgm-exporter')"
    ),
}


def open_gpu_source(
    kind: GpuSourceKind,
    *,
    scenario: pathlib.Path | None,
    simulated_count: int,
    require: bool = False,
) -> GpuSource | None:
    """The source for ``kind``; ``auto`` tries ``HARDWARE_SOURCES`` in turn, skips one
    that finds no GPU, and settles for None.

    Raises ``ValueError`` for bad flag values (the GPU count is checked with the other
    flags, and again by ``SimulatedSource``) and ``GpuSourceUnavailable`` when an
    explicitly chosen source cannot be opened, or, with ``require``, when no source
    with at least one GPU opens.
    """
    source, missing = _open(kind, scenario=scenario, simulated_count=simulated_count)
    if source is not None and not source.devices():
        missing = [f"{source.name}: no GPU found"]
    if not require:
        if source is None and kind == GpuSourceKind.AUTO:
            log.warning(
                "--gpu-source auto: no GPU source (%s); serving request metrics only",
                "; ".join(missing),
            )
        return source
    if missing == []:
        return source
    if source is not None:
        source.close()
    raise GpuSourceUnavailable(f"--require-gpu: no GPU found ({'; '.join(missing)})")


def _open(
    kind: GpuSourceKind, *, scenario: pathlib.Path | None, simulated_count: int
) -> tuple[GpuSource | None, list[str]]:
    """The source, and why none opened (empty when one did)."""
    if kind not in tuple(GpuSourceKind):
        raise ValueError(f"--gpu-source must be one of {', '.join(GpuSourceKind)}; got {kind!r}")
    if scenario is not None and kind != GpuSourceKind.SIMULATED:
        raise ValueError(
            f"--gpu-scenario applies to --gpu-source simulated only, not {str(kind)!r}"
        )
    if kind in RETIRED:
        raise ValueError(RETIRED[kind])
    if kind == GpuSourceKind.NONE:
        return None, ["--gpu-source none"]
    if kind == GpuSourceKind.SIMULATED:
        return open_simulated_source(simulated_count, scenario), []
    if kind == GpuSourceKind.AUTO:
        return _auto()
    (entry,) = (entry for entry in HARDWARE_SOURCES if entry.kind == kind)
    try:
        return entry.open(), []
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


def _auto() -> tuple[GpuSource | None, list[str]]:
    reasons = []
    for entry in HARDWARE_SOURCES:
        try:
            source = entry.open()
        except entry.unavailable as exc:
            reasons.append(f"{entry.kind}: {exc}")
            continue
        if not source.devices():  # the library answers but sees no GPU: try the next
            source.close()
            reasons.append(f"{entry.kind}: no GPU found")
            continue
        log.info("--gpu-source auto: using %s", source.name)
        return source, []
    return None, reasons
