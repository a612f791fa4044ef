"""``gpuscope doctor``: which GPU metrics this machine gives, and why the others are absent.

It opens the GPU source the exporter would open, takes two samples 150 ms apart
(GPM rates need two) and reports, per GPU and metric group, supported or not and
why (driver, architecture, permission), from the very readings the exporter
would serve; where a metric comes by a lesser way (memory v1, PCIe bytes estimated,
GPM answering NaN) it says so in the group's ``note``, and it names the pynvml
release in use. It also lists the processes on each GPU once, as the exporter would, and
says whether spans can be joined to GPUs by their pid here, why not (no GPU, no
permission, another pid namespace), and what happens instead. ``--json`` prints the
same as JSON (``scripts/gpu-check`` reads it), also when no GPU source opens
(``"source": null``, the errors, and what the exporter would do with the same
``--gpu-source``). ``--pid PID`` prints instead the sharing and topology checklist of
one serving process (``doctor_process``): MIG/MPS, co-tenants, NUMA, links, clocks.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

from gpuscope import flags
from gpuscope.exporter import doctor_process
from gpuscope.exporter.gpu import factory, numa
from gpuscope.exporter.gpu.capabilities import ExplainsSupport
from gpuscope.exporter.gpu.definitions import METRIC_GROUPS
from gpuscope.exporter.gpu.factory import GpuSourceUnavailable, open_gpu_source
from gpuscope.exporter.gpu.processes import FALLBACK, PROC, ProcessGpuMap, ProcessJoin
from gpuscope.exporter.gpu.scenario import ScenarioError
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading, GpuSource, GpuSourceKind
from gpuscope.flags import Settings, at_least, option

SAMPLE_GAP_S = 0.15  # GPM needs two samples at least 100 ms apart


@runtime_checkable
class NotesMethods(Protocol):
    """A source that says how a metric group is obtained where that is unusual (NVML)."""

    def notes(self) -> Mapping[int, Mapping[str, str]]: ...


def pynvml_version() -> str | None:
    """The installed nvidia-ml-py release (which symbols exist depends on it)."""
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class DoctorConfig(
    Settings,
    prog="gpuscope doctor",
    description="Show which GPU metrics this machine supports, and why the others are absent.",
):
    gpu_source: GpuSourceKind = option(GpuSourceKind.AUTO, help="GPU backend to examine")
    gpu_scenario: Path | None = option(None, help="scenario file for the simulated GPU source")
    simulated_gpus: int = option(
        1, help="number of simulated GPUs (with --gpu-source simulated)", check=at_least(1)
    )
    json: bool = option(False, help="print JSON instead of a table")
    pid: int | None = option(
        None,
        help="check one serving process instead: MIG/MPS, co-tenants, NUMA locality, links "
        "and clocks of the GPUs it (or a descendant) holds, each with what was read and the "
        "fix; exit 1 if it holds none",
    )


def diagnose(source: GpuSource, *, proc_root: Path = PROC) -> dict[str, Any]:
    """Two samples, then per GPU and metric group: supported, or why not; and the
    process join (``proc_root`` is for tests)."""
    source.sample()
    time.sleep(SAMPLE_GAP_S)  # hardware time must pass between the samples
    readings = {r.uuid: r for r in source.sample()}
    reasons: Mapping[int, Mapping[str, str]] = (
        source.unsupported_metrics() if isinstance(source, ExplainsSupport) else {}
    )
    notes: Mapping[int, Mapping[str, str]] = (
        source.notes() if isinstance(source, NotesMethods) else {}
    )
    # a MIG instance shares its parent's index: its support is keyed by its uuid
    instances: Mapping[str, tuple[Mapping[str, str], Mapping[str, str]]] = getattr(
        source, "mig_support", dict
    )()
    gpus = []
    for device in source.devices():
        reading = readings.get(device.uuid)
        why, note = (
            (reasons.get(device.index, {}), notes.get(device.index, {}))
            if device.mig is None
            else instances.get(device.uuid, ({}, {}))
        )
        entry: dict[str, Any] = {
            "index": device.index,
            "gpu": device.label,
            "uuid": device.uuid,
            "name": device.name,
            "driver_version": device.driver_version,
            "up": bool(reading and reading.up),
            "metrics": _groups(reading, why, note),
        }
        if device.mig is not None:
            entry["mig"] = dataclasses.asdict(device.mig)
        gpus.append(entry)
    unopened: Mapping[int, str] = getattr(source, "unopened_gpus", dict)()  # NVML only
    return {
        "source": source.name,
        "pynvml_version": pynvml_version() if source.name == GpuSourceKind.NVML else None,
        "gpus": gpus,
        "unopened_gpus": {str(index): why for index, why in unopened.items()},
        "process_join": process_join(source, proc_root=proc_root),
    }


def process_join(source: GpuSource | None, *, proc_root: Path = PROC) -> dict[str, Any]:
    """One listing of the GPUs' processes into a fresh map, as the exporter's poller does."""
    join = ProcessGpuMap(proc_root=proc_root)
    try:
        join.refresh(source)
    except Exception as exc:  # the exporter would keep trying; say what failed
        join.unavailable(ProcessJoin.NOT_SUPPORTED, f"listing the processes failed: {exc}")
    state = join.state()
    listing = state.listing
    gpus = {}
    devices = source.devices() if source is not None else ()
    for device in devices:
        refused = listing.refused.get(device.uuid)
        pids = list(listing.pids.get(device.uuid, ()))
        gpus[device.uuid] = {
            "index": device.index,
            "gpu": device.label,
            "pids": pids,
            "listed": device.uuid in listing.pids,
            "why": None if refused is None else refused.why,
            "note": listing.notes.get(device.uuid),
            "numa": numa_checks(device, pids, proc_root),
        }
    return {
        "status": state.status.value,
        "why": state.why,
        "processes": len(state.visible) if state.status is ProcessJoin.OK else 0,
        "gpus": gpus,
        "fallback": FALLBACK,
    }


def numa_checks(device: GpuDevice, pids: Sequence[int], proc: Path) -> dict[str, Any]:
    """The GPU's NUMA side and, per process on it, where it may run and the fix."""
    affinity = device.affinity
    if affinity is None:
        return {"known": False, "why": "neither NVML nor sysfs names this GPU's CPUs or node"}
    fix = numa.numactl(affinity)
    processes = []
    for pid in pids:
        allowed = numa.read_allowed(proc, pid)
        if allowed is None:
            continue  # gone, or not readable here
        where = numa.locality(allowed, affinity)
        processes.append(
            {
                "pid": pid,
                "cpus": numa.format_list(allowed.cpus),
                "nodes": numa.format_list(allowed.nodes),
                "locality": None if where is None else where.value,
                "fix": None
                if where in (None, numa.Locality.LOCAL) or fix is None
                else f"{fix} {_command(proc, pid)}",
            }
        )
    return {
        "known": True,
        "source": affinity.source,
        "cpus": numa.format_list(affinity.cpus),
        "nodes": numa.format_list(affinity.nodes),
        "processes": processes,
    }


def _command(proc: Path, pid: int) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return f"<the command of process {pid}>"
    return " ".join(shlex.quote(a.decode(errors="replace")) for a in raw.split(b"\0") if a)


def _groups(
    reading: GpuReading | None, reasons: Mapping[str, str], notes: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for group, fields in METRIC_GROUPS.items():
        if group in reasons:
            result[group] = {"supported": False, "why": reasons[group]}
        elif reading is None or not reading.up:
            result[group] = {"supported": False, "why": "the GPU is not answering (lost)"}
        elif group == "xid_errors":
            result[group] = {"supported": True, "why": None}  # present once an XID occurs
        elif any(reading.has(f) for f in fields):
            result[group] = {"supported": True, "why": None}
        else:
            result[group] = {"supported": False, "why": "no value from this source"}
        result[group]["note"] = notes.get(group)
    return result


def render(report: Mapping[str, Any], out: TextIO) -> None:
    version = report.get("pynvml_version")
    print(f"GPU source: {report['source']}", file=out)
    if version is not None:
        print(f"pynvml (nvidia-ml-py): {version}", file=out)
    for gpu in report["gpus"]:
        state = "" if gpu["up"] else "  [NOT ANSWERING]"
        driver = gpu["driver_version"]
        label = gpu.get("gpu", gpu["index"])
        print(f"\nGPU {label}  {gpu['name']}  {gpu['uuid']}  driver {driver}{state}", file=out)
        mig = gpu.get("mig")
        if mig is not None:
            print(
                f"  MIG instance of {mig['parent_uuid']}: profile {mig['profile']}, GPU instance"
                f" {mig['gpu_instance_id']}, compute instance {mig['compute_instance_id']}",
                file=out,
            )
        for group, entry in gpu["metrics"].items():
            mark = "yes" if entry["supported"] else "no "
            why = f"  - {entry['why']}" if entry["why"] else ""
            note = f"  ({entry['note']})" if entry.get("note") else ""
            print(f"  {mark}  {group}{why}{note}", file=out)
    for index, why in report.get("unopened_gpus", {}).items():
        print(f"\nGPU {index}  [NOT OPENED]  {why}", file=out)
    render_process_join(report["process_join"], out)


def render_process_join(join: Mapping[str, Any], out: TextIO) -> None:
    print(f"\nGPU process join: {join['status']}  - {join['why']}", file=out)
    for uuid, gpu in join["gpus"].items():
        if gpu["listed"]:
            pids = ", ".join(map(str, gpu["pids"])) or "none"
            listed = f"processes {pids}"
        else:
            listed = f"not listed: {gpu['why'] or 'no answer (lost?)'}"
        note = f"  ({gpu['note']})" if gpu["note"] else ""
        print(f"  GPU {gpu.get('gpu', gpu['index'])}  {uuid}: {listed}{note}", file=out)
        render_numa(gpu.get("numa"), out)
    if join["status"] == ProcessJoin.OK:
        print(
            "  spans whose process, or one of its descendants, holds a GPU are joined to it",
            file=out,
        )
    print(f"  otherwise: {join['fallback']}", file=out)


def render_numa(checks: Mapping[str, Any] | None, out: TextIO) -> None:
    if not checks:
        return
    if not checks["known"]:
        print(f"    NUMA: unknown ({checks['why']})", file=out)
        return
    print(
        f"    NUMA: the GPU is local to CPUs {checks['cpus'] or '?'}, node {checks['nodes'] or '?'}"
        f" ({checks['source']})",
        file=out,
    )
    for process in checks["processes"]:
        print(
            f"      process {process['pid']}: {process['locality'] or 'unknown'} (allowed CPUs "
            f"{process['cpus']}, memory nodes {process['nodes']})",
            file=out,
        )
        if process["fix"]:
            print(f"        fix: {process['fix']}", file=out)


def run(source: GpuSource, config: DoctorConfig, out: TextIO) -> int:
    if config.pid is not None:
        return run_process(source, config, config.pid, out)
    try:
        report = diagnose(source)
    finally:
        source.close()
    if config.json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        render(report, out)
    return 0


def run_process(source: GpuSource, config: DoctorConfig, pid: int, out: TextIO) -> int:
    try:
        report = doctor_process.checklist(source, pid)
    finally:
        source.close()
    if config.json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        doctor_process.render(report, out)
    return 0 if report["gpus"] else 1


def _open(config: DoctorConfig) -> tuple[GpuSource | None, list[str]]:
    auto = config.gpu_source == GpuSourceKind.AUTO
    kinds = [entry.kind for entry in factory.HARDWARE_SOURCES] if auto else [config.gpu_source]
    errors = []
    for kind in kinds:
        try:
            source = open_gpu_source(
                kind, scenario=config.gpu_scenario, simulated_count=config.simulated_gpus
            )
        except GpuSourceUnavailable as exc:
            errors.append(str(exc))
            continue
        if source is not None:
            return source, errors
    return None, errors


def exporter_outcome(gpu_source: str) -> str:
    """What ``gpuscope exporter`` does with this ``--gpu-source`` when no GPU answers."""
    if gpu_source == GpuSourceKind.AUTO:
        return "the exporter would serve request metrics only (with --require-gpu it would exit)"
    if gpu_source == GpuSourceKind.NONE:
        return "the exporter would serve request metrics only"
    return (
        f"'gpuscope exporter --gpu-source {gpu_source}' would exit with an error "
        "(use --gpu-source auto or none to serve request metrics only)"
    )


def no_source_report(config: DoctorConfig, errors: Sequence[str]) -> dict[str, Any]:
    """The ``--json`` report when no GPU source opened: same shape, no GPUs."""
    return {
        "source": None,
        "gpus": [],
        "errors": list(errors or ["--gpu-source none"]),
        "exporter": exporter_outcome(config.gpu_source),
        "process_join": process_join(None),
    }


def main(argv: list[str]) -> int:
    config = flags.parse(DoctorConfig, argv)
    try:
        source, errors = _open(config)
    except (ValueError, ScenarioError) as exc:
        print(f"gpuscope doctor: {exc}", file=sys.stderr)
        return 2
    if source is None:
        report = no_source_report(config, errors)
        if config.json:  # the document instead of the text, as --help says; exit 1 still
            json.dump(report, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 1
        print(f"gpuscope doctor: no GPU source; {report['exporter']}.", file=sys.stderr)
        for error in report["errors"]:
            print(f"  {error}", file=sys.stderr)
        print(f"GPU process join: no_gpu_source; {FALLBACK}.", file=sys.stderr)
        return 1
    return run(source, config, sys.stdout)
