"""MIG on the C fake NVML with the captures of an H200 and an H100 in MIG mode: the fake
answers NVML's MIG entry points as nvml.h says, the exporter serves each MIG instance as
a GPU of its own with its parent, each instance reads its GPU instance's GPM, and a
process running on one instance (or a span naming its UUID) joins that instance. The
H200's layout puts two compute instances in one GPU instance (2 / 0 and 2 / 1); the
H100's gives each GPU instance one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_gpu_cnvml_defects import value, wait_for
from test_gpu_cnvml_exporter import exporter, scraped

from gpuscope import spans as contract
from gpuscope.contract.exporter import REQUEST_DURATION
from support.cnvml import library, profiles
from support.exporter_fixtures import T0, encode

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

PARENT = "GPU-00000000-0000-0000-0000-000000000000"
MIB = 2**20
Instance = tuple[int, str, str, int, int, int]  # MIG device, UUID, profile, GI, CI, MiB


@dataclass(frozen=True)
class MigCapture:
    """What one MIG-mode capture shows, written out by hand from its sections."""

    capture: str  # profiles.capture() name
    gpu_name: str  # query-gpu name
    instances: list[Instance]  # -L list and MIG table (total: Shared Memory-Usage)
    busy: int  # the MIG device the load's processes ran on (the table's GI / CI)
    busy_used_mib: int  # its Shared Memory-Usage under load
    busy_pids: list[int]  # the load table's processes, in order
    # GPM: SM occupancy (percent) set on the parent ("gpu.0") and on some MIG devices
    # ("gpu.0.mig.<n>"), and the ratio each instance then reads, by MIG device
    occupancy_set: dict[str, int]
    occupancy_read: list[float]


H200_MIG = MigCapture(
    capture="nvidia-h200-mig__590",
    gpu_name="NVIDIA H200",
    instances=[
        (0, "MIG-00000000-0000-0000-0000-000000000000", "1c.3g.71gb", 2, 0, 71424),
        (1, "MIG-00000001-0000-0000-0000-000000000001", "2c.3g.71gb", 2, 1, 71424),
        (2, "MIG-00000002-0000-0000-0000-000000000002", "2g.35gb", 3, 0, 33280),
        (3, "MIG-00000003-0000-0000-0000-000000000003", "1g.18gb", 9, 0, 16384),
        (4, "MIG-00000004-0000-0000-0000-000000000004", "1g.18gb", 10, 0, 16384),
    ],
    # the load's three processes ran on GI 2 / CI 1, MIG device 1 (16925 MiB used)
    busy=1,
    busy_used_mib=16925,
    busy_pids=[12249, 12250, 12267],
    # MIG devices 0 and 1 are GPU instance 2's two compute instances (both read GI 2's
    # 80 %), device 3 is GI 9 (12 %); GIs 3 and 10 have no values of their own and read
    # the parent's (30 %)
    occupancy_set={"gpu.0": 30, "gpu.0.mig.1": 80, "gpu.0.mig.3": 12},
    occupancy_read=[0.8, 0.8, 0.3, 0.12, 0.3],
)
H100_MIG = MigCapture(
    capture="nvidia-h100-mig__590",
    gpu_name="NVIDIA H100 80GB HBM3",
    instances=[
        (0, "MIG-00000000-0000-0000-0000-000000000000", "3g.40gb", 2, 0, 40448),
        (1, "MIG-00000001-0000-0000-0000-000000000001", "2g.20gb", 3, 0, 20096),
        (2, "MIG-00000002-0000-0000-0000-000000000002", "1g.10gb", 9, 0, 9984),
        (3, "MIG-00000003-0000-0000-0000-000000000003", "1g.10gb", 10, 0, 9984),
    ],
    # the load's three processes ran on GI 2 / CI 0, MIG device 0 (11091 MiB used)
    busy=0,
    busy_used_mib=11091,
    busy_pids=[21180, 21181, 21198],
    # one compute instance per GPU instance: device 0 (GI 2) reads 80 %, device 2 (GI 9)
    # 12 %, GIs 3 and 10 the parent's 30 %
    occupancy_set={"gpu.0": 30, "gpu.0.mig.0": 80, "gpu.0.mig.2": 12},
    occupancy_read=[0.8, 0.3, 0.12, 0.3],
)
MIGS = pytest.mark.parametrize("mig", [H200_MIG, H100_MIG], ids=["h200-mig", "h100-mig"])
RELEASES = [library.PYNVML_FLOOR, library.PYNVML_NEWEST]
# series of the parent GPU only, never repeated on its instances
PARENTS_OWN = (
    "gpuscope_gpu_power_watts",
    "gpuscope_gpu_sm_clock_hertz",
    "gpuscope_gpu_xid_events_total",
    "gpuscope_gpu_pcie_transmit_bytes_total",
)


def _environment(profile: Path, release: str, **knobs: str) -> dict[str, str]:
    """The fake with ``release`` of pynvml, as a driver of its time: the floor (12.535.77)
    reads the 32-byte process records an R535 driver writes, the newest the 24-byte ones."""
    if release == library.PYNVML_FLOOR:
        knobs.setdefault("PROCESS_STRIDE", "32")
        return library.environment(profile, branch=535, pynvml=release, knobs=knobs)
    return library.environment(profile, pynvml=release, knobs=knobs)


def _profile(tmp_path: Path, state: str = "idle", mig: MigCapture = H200_MIG) -> Path:
    capture = profiles.capture(mig.capture)
    return profiles.profile_from_capture(capture, state=state).write(tmp_path / f"mig-{state}")


PROBE = """
import json, pynvml
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"mode": list(pynvml.nvmlDeviceGetMigMode(gpu)),
       "max": pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu), "instances": []}
for slot in range(out["max"]):
    try:
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
    except pynvml.NVMLError_NotFound:
        out.setdefault("not_found", []).append(slot)
        continue
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
    try:
        pynvml.nvmlDeviceGetClockInfo(mig, pynvml.NVML_CLOCK_SM)
        clock = "answered"
    except pynvml.NVMLError as exc:
        clock = str(exc)
    out["instances"].append({
        "slot": slot, "uuid": pynvml.nvmlDeviceGetUUID(mig), "name": pynvml.nvmlDeviceGetName(mig),
        "is_mig": pynvml.nvmlDeviceIsMigDeviceHandle(mig).value,  # pynvml returns the c_uint
        "gi": pynvml.nvmlDeviceGetGpuInstanceId(mig),
        "ci": pynvml.nvmlDeviceGetComputeInstanceId(mig),
        "parent": pynvml.nvmlDeviceGetUUID(parent), "total": memory.total, "used": memory.used,
        "pids": [(p.pid, getattr(p, "gpuInstanceId", None), getattr(p, "computeInstanceId", None))
                 for p in procs],
        "clock": clock})
out["aggregate"] = sorted((p.pid, getattr(p, "gpuInstanceId", None))
                          for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu))
try:
    pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(gpu)
except pynvml.NVMLError_InvalidArgument:
    out["parent_of_parent"] = "invalid argument"
print(json.dumps(out))
"""


@MIGS
@pytest.mark.parametrize("release", RELEASES)
def test_the_fake_answers_nvmls_mig_entry_points(
    tmp_path: Path, release: str, mig: MigCapture
) -> None:
    env = _environment(_profile(tmp_path, "load", mig), release)
    done = library.run_python(PROBE, env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # Hopper: seven MIG devices at most; the slots no instance holds answer NOT_FOUND
    assert out["mode"] == [1, 1] and out["max"] == 7
    assert out["not_found"] == list(range(len(mig.instances), 7))
    assert out["parent_of_parent"] == "invalid argument"
    keys = ("slot", "uuid", "name", "gi", "ci", "total")
    got = [tuple(i[k] for k in keys) for i in out["instances"]]
    assert got == [
        (slot, uuid, f"{mig.gpu_name} MIG {profile}", gi, ci, mib * MIB)
        for slot, uuid, profile, gi, ci, mib in mig.instances
    ]
    assert {i["parent"] for i in out["instances"]} == {PARENT}
    assert all(i["is_mig"] for i in out["instances"])
    assert all(i["clock"] == "Not Supported" for i in out["instances"])
    # the load table's processes, on the one instance they ran on, with its GI / CI
    busy = out["instances"][mig.busy]
    assert busy["used"] == mig.busy_used_mib * MIB
    records = [(pid, gi, ci) for pid, gi, ci in busy["pids"]]
    assert [pid for pid, _, _ in records] == mig.busy_pids
    _, _, _, busy_gi, busy_ci, _ = mig.instances[mig.busy]
    assert {(gi, ci) for _, gi, ci in records} == {(busy_gi, busy_ci)}  # the record's ids
    assert [pid for pid, _ in out["aggregate"]] == mig.busy_pids
    assert all(i["pids"] == [] for i in out["instances"] if i["slot"] != mig.busy)


def _line(lines: list[str], name: str, **labels: str) -> str | None:
    found = [
        line
        for line in lines
        if line.startswith(name + "{")
        and all(re.search(f'[{{,]{k}="{re.escape(v)}"', line) for k, v in labels.items())
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


@MIGS
@pytest.mark.parametrize("release", RELEASES)
def test_each_mig_instance_is_served_as_a_gpu_with_its_parent(
    tmp_path: Path, release: str, mig: MigCapture
) -> None:
    lines = scraped(_environment(_profile(tmp_path, mig=mig), release))
    for slot, uuid, profile, gi, ci, mib in mig.instances:
        gpu = f"0:{slot}"
        info = _line(lines, "gpuscope_gpu_mig_info", uuid=uuid)
        assert info is not None, uuid
        for key, want in (("gpu", gpu), ("parent_gpu", "0"), ("parent_uuid", PARENT),
                          ("profile", profile), ("gpu_instance_id", str(gi)),
                          ("compute_instance_id", str(ci))):  # fmt: skip
            assert re.search(f'[{{,]{key}="{want}"', info), (key, info)
        up = _line(lines, "gpuscope_gpu_up", uuid=uuid)
        assert up is not None and up.endswith(" 1.0") and f'gpu="{gpu}"' in up
        total = _line(lines, "gpuscope_gpu_memory_total_bytes", uuid=uuid)
        assert total is not None and float(total.rpartition(" ")[2]) == mib * MIB
        for name in PARENTS_OWN:
            assert _line(lines, name, uuid=uuid) is None, (name, uuid)
    # the parent keeps every series it had, and no instance more than the capture has
    assert _line(lines, "gpuscope_gpu_power_watts", uuid=PARENT) is not None
    assert _line(lines, "gpuscope_gpu_xid_events_total", uuid=PARENT) is not None
    assert _line(lines, "gpuscope_gpu_mig_info", uuid=PARENT) is None
    served = {m.group(1) for line in lines if (m := re.search(r'[{,]uuid="([^"]+)"', line))}
    assert served == {PARENT} | {uuid for _, uuid, *_ in mig.instances}


# NVML_GPM_METRIC_SM_OCCUPANCY
OCCUPANCY = profiles.GPM_SM_OCCUPANCY


def _ratio(lines: list[str], name: str, uuid: str) -> float | None:
    line = _line(lines, name, uuid=uuid)
    return None if line is None else float(line.rpartition(" ")[2])


@MIGS
@pytest.mark.parametrize("release", RELEASES)
def test_each_mig_instance_has_its_gpu_instances_gpm(
    tmp_path: Path, release: str, mig: MigCapture
) -> None:
    # nvmlGpmMigSampleGet per GPU instance (Hopper has GPM): an instance reads its GPU
    # instance's values, a GPU instance without values of its own the parent's
    per_instance = ";".join(
        f"{key}.gpm.{OCCUPANCY}={percent}" for key, percent in mig.occupancy_set.items()
    )
    lines = scraped(_environment(_profile(tmp_path, mig=mig), release, SET=per_instance))
    occupancy = "gpuscope_gpu_sm_occupancy_ratio"
    assert _ratio(lines, occupancy, PARENT) == mig.occupancy_set["gpu.0"] / 100
    uuids = [uuid for _, uuid, *_ in mig.instances]
    got = {uuid: _ratio(lines, occupancy, uuid) for uuid in uuids}
    assert got == dict(zip(uuids, mig.occupancy_read, strict=True))
    for uuid in uuids:
        for name in ("sm_active", "tensor_active", "dram_active"):
            assert _ratio(lines, f"gpuscope_gpu_{name}_ratio", uuid) is not None, (name, uuid)


def _doctor(env: dict[str, str]) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "gpuscope.cli", "doctor", "--gpu-source", "nvml", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    gpus: list[dict[str, object]] = json.loads(done.stdout)["gpus"]
    return gpus


@pytest.mark.parametrize("error", ["FUNCTION_NOT_FOUND", "NOT_SUPPORTED"])
def test_without_per_instance_gpm_the_parent_keeps_it_and_doctor_says_why(
    tmp_path: Path, error: str
) -> None:
    # a driver without nvmlGpmMigSampleGet (the symbol missing: pynvml raises
    # FunctionNotFound) or refusing it: the instances carry no GPM series, the parent does
    env = _environment(
        _profile(tmp_path), library.PYNVML_NEWEST, ERRORS=f"nvmlGpmMigSampleGet:{error}"
    )
    lines = scraped(env)
    assert _ratio(lines, "gpuscope_gpu_sm_occupancy_ratio", PARENT) == 0.0
    for _, uuid, *_ in H200_MIG.instances:
        assert _ratio(lines, "gpuscope_gpu_sm_occupancy_ratio", uuid) is None, uuid
        assert _ratio(lines, "gpuscope_gpu_memory_total_bytes", uuid) is not None, uuid
    gpm = _doctor(env)[1]["metrics"]["gpm"]  # type: ignore[index]
    assert gpm["supported"] is False
    assert "nvmlGpmMigSampleGet" in gpm["why"] and f"({PARENT}) hold it" in gpm["why"], gpm


JOIN = """
import os, subprocess, sys, json
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
os.environ["FAKE_NVML_SET"] = f"gpu.0.mig.3.processes.compute={worker.pid}:1048576"
from gpuscope.exporter.gpu.nvml.source import NvmlSource
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.contract.exporter import REQUEST_DURATION
sys.path[:0] = ["tests", "tests/exporter/gpu"]
from support.exporter_fixtures import T0, encode
from test_gpu_process_join import server_span
source = NvmlSource()
poller = GpuPoller(source, 1.0, process_interval_s=0.0)
poller.poll_once()
aggregator = SpanAggregator(uuids_for_pid=poller.processes.uuids_for_claim)
aggregator.set_gpu_devices(source.devices())
aggregator.ingest(encode([server_span({"process.pid": worker.pid})]))
uuid, gpu = REQUEST_DURATION.labels.index("uuid"), REQUEST_DURATION.labels.index("gpu")
state = poller.processes.state()
print(json.dumps({"joined": sorted((l[uuid], l[gpu]) for l, _ in aggregator.duration.items()),
                  "status": state.status.value, "why": state.why}))
poller.stop()
worker.kill()
"""


@MIGS
@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("unprivileged", ["0", "1"])
def test_a_request_whose_process_runs_on_an_instance_joins_that_instance(
    tmp_path: Path, release: str, unprivileged: str, mig: MigCapture
) -> None:
    # without root the parent's aggregate list is refused (nvml.h), the instance's is not;
    # MIG device 3 (the H200's 1g.18gb on GI 9, the H100's 1g.10gb on GI 10) runs nothing
    # in the idle capture: JOIN puts the worker there
    env = _environment(_profile(tmp_path, mig=mig), release, UNPRIVILEGED=unprivileged)
    done = library.run_python(JOIN, env, timeout_s=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["status"] == "ok", out["why"]
    assert out["joined"] == [[mig.instances[3][1], "0:3"]]


def _span_on(uuid: str) -> bytes:
    """An OTLP body: one gpuscope server span naming GPU ``uuid`` (gpuscope.gpu.uuid),
    as a worker started with CUDA_VISIBLE_DEVICES=<that MIG UUID> reports it."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "mig-service"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    span = provider.get_tracer(contract.INSTRUMENTATION_NAME).start_span(
        "POST /v1/completions",
        kind=SpanKind.SERVER,
        attributes={
            contract.HTTP_ROUTE: "/v1/completions",
            contract.HTTP_RESPONSE_STATUS_CODE: 200,
            contract.GPU_UUID: uuid,
        },
        start_time=T0,
    )
    span.end(end_time=T0 + 50_000_000)
    body: bytes = encode(memory.get_finished_spans()).SerializeToString()
    return body


@MIGS
@pytest.mark.parametrize("release", RELEASES)
def test_a_span_naming_a_mig_uuid_is_recorded_against_that_instance(
    tmp_path: Path, release: str, mig: MigCapture
) -> None:
    uuid = mig.instances[3][1]
    with exporter(_environment(_profile(tmp_path, mig=mig), release)) as url:
        request = urllib.request.Request(
            f"{url}/v1/traces",
            data=_span_on(uuid),
            headers={"Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
    counts = [
        line
        for line in text.splitlines()
        if line.startswith(f"{REQUEST_DURATION.name}_count{{") and 'service="mig-service"' in line
    ]
    assert len(counts) == 1, counts
    assert 'gpu="0:3"' in counts[0] and f'uuid="{uuid}"' in counts[0], counts
    assert float(counts[0].rpartition(" ")[2]) == 1, counts


@MIGS
def test_doctor_lists_each_instance_with_its_parent(tmp_path: Path, mig: MigCapture) -> None:
    env = library.environment(_profile(tmp_path, mig=mig))
    done = subprocess.run(
        [sys.executable, "-m", "gpuscope.cli", "doctor", "--gpu-source", "nvml", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    gpus = json.loads(done.stdout)["gpus"]
    assert [g["gpu"] for g in gpus] == ["0"] + [f"0:{slot}" for slot, *_ in mig.instances]
    parent, first = gpus[0], gpus[1]
    _, _, profile, gi, _, _ = mig.instances[0]
    assert "mig" not in parent and parent["metrics"]["power"]["supported"]
    assert first["mig"]["parent_uuid"] == PARENT and first["mig"]["profile"] == profile
    assert first["metrics"]["memory"]["supported"]
    assert first["metrics"]["gpm"]["supported"]
    note = f"GPU instance {gi}'s counters (nvmlGpmMigSampleGet)"
    assert note in first["metrics"]["gpm"]["note"]
    assert "parent GPU" in first["metrics"]["pcie_bytes"]["why"]
    assert re.search(r"Not Supported|not supported", first["metrics"]["power"]["why"])


def test_a_lost_mig_gpu_takes_its_instances_down_and_back(tmp_path: Path) -> None:
    # the parent falls off the bus for two seconds: its instances with it, then all return
    env = _environment(_profile(tmp_path), library.PYNVML_NEWEST, LOST="0:after_s=1.5:until_s=3.5")
    instance = f'gpuscope_gpu_up{{gpu="0:3",uuid="{H200_MIG.instances[3][1]}"}}'
    with exporter(env) as url:
        wait_for(url, lambda t: value(t, instance) == 0, timeout_s=15)
        text = wait_for(url, lambda t: value(t, instance) == 1, timeout_s=15)
    assert value(text, f'gpuscope_gpu_up{{gpu="0",uuid="{PARENT}"}}') == 1
