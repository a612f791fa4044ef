"""Scenario files for the simulated GPU: a schedule of faults, in YAML or JSON.

A scenario is a list of events, each applying to one GPU (``gpu: 1``) or all of
them (``gpu: all``) from ``at`` seconds after the source started, for ``duration``
seconds (absent: until the end)::

    events:
      - {at: 10, duration: 20, gpu: 0, fault: clock_throttle, reason: sw_power_cap, factor: 0.6}
      - {at: 15, duration: 10, gpu: all, fault: pcie_saturation, direction: rx}
      - {at: 30, gpu: 1, fault: xid, xid: 79, count: 3}
      - {at: 40, duration: 15, gpu: 1, fault: fall_off_bus}
      - {at: 0, gpu: 0, fault: not_supported, fields: [sm_occupancy_ratio]}
      - {at: 5, duration: 60, gpu: all, fault: load, level: 0.8}
      - {at: 0, duration: 30, gpu: 1, fault: process, pid: 4242}
      - {at: 0, duration: 600, gpu: 0, fault: memory_used, level: 0.97}
      - {at: 20, gpu: 0, fault: ecc, type: volatile_corrected, count: 5}
      - {at: 0, duration: 600, fault: collector_error, collector: xid_events}

``process`` is no fault: it lists ``pid`` among the GPU's running processes while it
lasts, as NVML would, for the process join (``processes``). ``memory_used`` holds at
least ``level`` of the GPU's memory in use while it lasts. ``xid`` and ``ecc`` happen
once, at ``at``: ``count`` more errors of that XID, or of that ECC counter type (an
XID that reports an uncorrectable ECC error raises ``volatile_uncorrected`` too, as
the driver does). ``collector_error`` makes a collector fail every run while it
lasts: ``sample`` the whole source, ``xid_events`` the XID event helper only.
Errors name the file and the event, and nothing is half-loaded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuscope.contract.gpu import PER_GPU
from gpuscope.exporter.gpu.clock_reasons import CLOCK_EVENT_REASONS

FAULTS = frozenset(
    {
        "clock_throttle",
        "pcie_saturation",
        "xid",
        "fall_off_bus",
        "not_supported",
        "load",
        "process",
        "memory_used",
        "ecc",
        "collector_error",
    }
)
# The ECC counter types every simulated GPU serves (NVML's volatile counts).
ECC_TYPES = ("volatile_corrected", "volatile_uncorrected")
# What ``collector_error`` can make fail: ``sample`` the whole source (every read
# raises, as NVML does when the driver goes away: the poller reports every GPU down),
# ``xid_events`` only the XID event helper (the GPUs keep reporting).
COLLECTORS = ("sample", "xid_events")
# readings a scenario may declare NotSupported: every per-GPU row's field, and the
# clock event reasons and ECC counts
OPTIONAL_FIELDS = frozenset(row.field for row in PER_GPU) | {
    "clock_event_reasons",
    "ecc_errors_total",
}
_KEYS: dict[str, frozenset[str]] = {
    "clock_throttle": frozenset({"reason", "factor"}),
    "pcie_saturation": frozenset({"direction"}),
    "xid": frozenset({"xid", "count"}),
    "fall_off_bus": frozenset(),
    "not_supported": frozenset({"fields"}),
    "load": frozenset({"level"}),
    "process": frozenset({"pid"}),
    "memory_used": frozenset({"level"}),
    "ecc": frozenset({"type", "count"}),
    "collector_error": frozenset({"collector"}),
}
_COMMON_KEYS = frozenset({"at", "duration", "gpu", "fault"})


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the event."""


@dataclass(frozen=True)
class ScenarioEvent:
    fault: str
    at_s: float
    duration_s: float | None  # None: lasts until the source stops
    gpu: int | None  # None: every GPU
    reason: str = "sw_power_cap"
    factor: float = 0.5  # clock_throttle: SM clock as a fraction of its maximum
    direction: str = "both"  # pcie_saturation: tx, rx or both
    xid: int = 0
    count: int = 1
    fields: frozenset[str] = frozenset()
    level: float = 0.0  # load: busy fraction 0-1; memory_used: used fraction of total
    pid: int = 0  # process: the pid listed on the GPU
    type: str = "volatile_uncorrected"  # ecc: the counter it raises
    collector: str = "sample"  # collector_error: what fails

    def applies(self, gpu: int, t: float) -> bool:
        """Whether this (lasting) event affects ``gpu`` at ``t`` seconds."""
        if self.gpu is not None and self.gpu != gpu:
            return False
        end = math.inf if self.duration_s is None else self.at_s + self.duration_s
        return self.at_s <= t < end


@dataclass(frozen=True)
class Scenario:
    events: tuple[ScenarioEvent, ...] = ()

    def highest_gpu(self) -> int:
        """The highest GPU index an event names (-1 if none names one)."""
        return max((e.gpu for e in self.events if e.gpu is not None), default=-1)


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file (``.json``; anything else is read as YAML)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise ScenarioError(f"{path}: not valid {kind}: {exc}") from exc
    return parse_scenario(data, source=str(path))


def parse_scenario(data: object, *, source: str = "scenario") -> Scenario:
    if data is None:
        return Scenario()
    if not isinstance(data, Mapping) or set(data) - {"events"}:
        raise ScenarioError(f"{source}: expected a mapping with one key, 'events'")
    raw_events = data.get("events") or []
    if not isinstance(raw_events, list):
        raise ScenarioError(f"{source}: 'events' must be a list")
    return Scenario(
        tuple(_parse_event(raw, f"{source}: event {i}") for i, raw in enumerate(raw_events))
    )


def _parse_event(raw: object, where: str) -> ScenarioEvent:
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected a mapping")
    fault = raw.get("fault")
    if fault not in FAULTS:
        raise ScenarioError(f"{where}: 'fault' must be one of {sorted(FAULTS)}, got {fault!r}")
    unknown = set(raw) - _COMMON_KEYS - _KEYS[fault]
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {sorted(unknown)} for fault {fault!r}")
    duration = raw.get("duration")
    event = ScenarioEvent(
        fault=fault,
        at_s=_number(raw.get("at", 0), where, "at", low=0.0),
        duration_s=None if duration is None else _number(duration, where, "duration", low=0.0),
        gpu=_gpu(raw.get("gpu", "all"), where),
    )
    return _with_fault_options(event, raw, where)


def _with_fault_options(event: ScenarioEvent, raw: Mapping[str, Any], where: str) -> ScenarioEvent:
    options: dict[str, Any] = {}
    if event.fault == "clock_throttle":
        reason = raw.get("reason", "sw_power_cap")
        if reason not in CLOCK_EVENT_REASONS:
            raise ScenarioError(f"{where}: 'reason' must be one of {sorted(CLOCK_EVENT_REASONS)}")
        options = {
            "reason": reason,
            "factor": _number(raw.get("factor", 0.5), where, "factor", 0.0, 1.0),
        }
    elif event.fault == "pcie_saturation":
        direction = raw.get("direction", "both")
        if direction not in ("tx", "rx", "both"):
            raise ScenarioError(f"{where}: 'direction' must be tx, rx or both, got {direction!r}")
        options = {"direction": direction}
    elif event.fault == "xid":
        options = {
            "xid": _integer(raw.get("xid"), where, "xid"),
            "count": _integer(raw.get("count", 1), where, "count"),
        }
    elif event.fault == "not_supported":
        names = raw.get("fields")
        if not isinstance(names, list) or not names or not set(names) <= OPTIONAL_FIELDS:
            raise ScenarioError(
                f"{where}: 'fields' must be a non-empty list of {sorted(OPTIONAL_FIELDS)}"
            )
        options = {"fields": frozenset(names)}
    elif event.fault == "load":
        options = {"level": _number(raw.get("level"), where, "level", 0.0, 1.0)}
    elif event.fault == "process":
        options = {"pid": _integer(raw.get("pid"), where, "pid")}
    elif event.fault == "memory_used":
        options = {"level": _number(raw.get("level"), where, "level", 0.0, 1.0)}
    elif event.fault == "ecc":
        kind = raw.get("type", "volatile_uncorrected")
        if kind not in ECC_TYPES:
            raise ScenarioError(f"{where}: 'type' must be one of {list(ECC_TYPES)}, got {kind!r}")
        options = {"type": kind, "count": _integer(raw.get("count", 1), where, "count")}
    elif event.fault == "collector_error":
        collector = raw.get("collector", "sample")
        if collector not in COLLECTORS:
            raise ScenarioError(
                f"{where}: 'collector' must be one of {list(COLLECTORS)}, got {collector!r}"
            )
        if event.gpu is not None:  # a collector reads every GPU: it cannot fail for one
            raise ScenarioError(f"{where}: a collector_error applies to every GPU (gpu: all)")
        options = {"collector": collector}
    return ScenarioEvent(**{**event.__dict__, **options})


def _number(
    value: object, where: str, key: str, low: float = -math.inf, high: float = math.inf
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ScenarioError(f"{where}: {key!r} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _integer(value: object, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScenarioError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return value


def _gpu(value: object, where: str) -> int | None:
    if value == "all":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScenarioError(f"{where}: 'gpu' must be a GPU index or 'all', got {value!r}")
    return value
