"""Chooses and opens the GPU source named by ``--gpu-source``."""

from __future__ import annotations

import logging
import pathlib

from gpuscope.exporter.gpu.dcgm import DcgmSource, DcgmUnavailable
from gpuscope.exporter.gpu.nvml import NvmlSource, NvmlUnavailable
from gpuscope.exporter.gpu.scenario import load_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.gpu.source import GpuSource, GpuSourceKind

log = logging.getLogger(__name__)


class GpuSourceUnavailable(RuntimeError):
    """The GPU source asked for explicitly cannot be opened; the message names the flag."""


def open_gpu_source(
    kind: GpuSourceKind, *, scenario: pathlib.Path | None, simulated_count: int
) -> GpuSource | None:
    """The source for ``kind``; ``auto`` tries DCGM, then NVML, and settles for None.

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
    if kind == GpuSourceKind.DCGM:
        try:
            return DcgmSource()
        except DcgmUnavailable as exc:
            raise GpuSourceUnavailable(f"--gpu-source dcgm: {exc}") from exc
    if kind == GpuSourceKind.NVML:
        try:
            return NvmlSource()
        except NvmlUnavailable as exc:
            raise GpuSourceUnavailable(f"--gpu-source nvml: {exc}") from exc
    return _auto()


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
    for opener, unavailable in ((DcgmSource, DcgmUnavailable), (NvmlSource, NvmlUnavailable)):
        try:
            source: GpuSource = opener()
        except unavailable as exc:
            reasons.append(str(exc))
            continue
        log.info("--gpu-source auto: using %s", source.name)
        return source
    log.warning(
        "--gpu-source auto: no GPU source (%s); serving request metrics only", "; ".join(reasons)
    )
    return None
