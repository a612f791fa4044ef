"""Chooses and opens the GPU source named by ``--gpu-source``."""

from __future__ import annotations

import logging
import pathlib

from gpuscope.exporter.gpu.dcgm import DcgmSource, DcgmUnavailable
from gpuscope.exporter.gpu.nvml import NvmlSource, NvmlUnavailable
from gpuscope.exporter.gpu.scenario import load_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.gpu.source import GpuSource

log = logging.getLogger(__name__)

KINDS = ("auto", "nvml", "dcgm", "simulated", "none")


class GpuSourceUnavailable(RuntimeError):
    """The GPU source asked for explicitly cannot be opened; the message names the flag."""


def open_gpu_source(
    kind: str, *, scenario: pathlib.Path | None, simulated_count: int
) -> GpuSource | None:
    """The source for ``kind``; ``auto`` tries DCGM, then NVML, and settles for None.

    Raises ``ValueError`` for bad flag values and ``GpuSourceUnavailable`` when an
    explicitly chosen source cannot be opened.
    """
    if kind not in KINDS:
        raise ValueError(f"--gpu-source must be one of {', '.join(KINDS)}; got {kind!r}")
    if scenario is not None and kind != "simulated":
        raise ValueError(f"--gpu-scenario applies to --gpu-source simulated only, not {kind!r}")
    if kind == "none":
        return None
    if kind == "simulated":
        if simulated_count < 1:
            raise ValueError(f"--simulated-gpus must be at least 1; got {simulated_count}")
        loaded = None if scenario is None else load_scenario(scenario)
        try:
            return SimulatedSource(simulated_count, loaded)
        except ValueError as exc:
            raise ValueError(f"--gpu-scenario {scenario}: {exc}") from exc
    if kind == "dcgm":
        try:
            return DcgmSource()
        except DcgmUnavailable as exc:
            raise GpuSourceUnavailable(f"--gpu-source dcgm: {exc}") from exc
    if kind == "nvml":
        try:
            return NvmlSource()
        except NvmlUnavailable as exc:
            raise GpuSourceUnavailable(f"--gpu-source nvml: {exc}") from exc
    return _auto()


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
