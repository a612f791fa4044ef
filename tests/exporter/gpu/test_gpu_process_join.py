"""The process join: span pids to the GPUs their processes (or children) hold.

Through the fake NVML and a fake ``/proc`` tree in a temporary folder; the simulated
source's cases run against the real ``/proc`` with a real process tree, up to the span
aggregator that asks the map (``uuids_for_pid``).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from gpuscope import spans as contract
from gpuscope.contract.exporter import REQUEST_DURATION
from gpuscope.exporter.doctor import DoctorConfig, diagnose, no_source_report, run
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.nvml.source import NvmlSource
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.processes import (
    ProcessGpuMap,
    ProcessJoin,
    read_parent,
)
from gpuscope.exporter.gpu.scenario import ScenarioError, parse_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource, simulated_uuid
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from support.exporter_fixtures import T0, encode
from support.gpu_fake_nvml import AMPERE, FakeNvml, fake_gpu

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

EXPORTER_PID = 50
# An init, a shell, vLLM's API server (100), its EngineCore (200) and one Worker per
# GPU (300, 301), and an unrelated process (400).
TREE = {1: 0, 10: 1, EXPORTER_PID: 10, 100: 10, 200: 100, 300: 200, 301: 200, 400: 1}
COMMANDS = {100: "python3", 200: "VLLM::EngineCor", 300: "VLLM::Worker_TP", 301: "a) b (c"}


class FakeProc:
    """A /proc tree with just the ``stat`` files the join reads, as the kernel writes them."""

    def __init__(self, root: Path, tree: dict[int, int] | None = None) -> None:
        self.root = root
        for pid, parent in (TREE if tree is None else tree).items():
            self.add(pid, parent)

    def add(self, pid: int, parent: int) -> None:
        folder = self.root / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        command = COMMANDS.get(pid, "bash")
        (folder / "stat").write_text(
            f"{pid} ({command}) S {parent} {pid} {parent} 0 -1 4194560 1234 0 0 0 12 3 0 0 20 0 "
            "5 0 1234567 123456789 4321 18446744073709551615 1 1 0 0 0 0 0 16781312 17442 0 0 0 "
            "17 3 0 0 0 0 0\n",
            encoding="ascii",
        )

    def remove(self, pid: int) -> None:
        (self.root / str(pid) / "stat").unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def join_map(proc: FakeProc) -> ProcessGpuMap:
    return ProcessGpuMap(proc_root=proc.root, own_pid=EXPORTER_PID)


def open_source(fake: FakeNvml) -> NvmlSource:
    return NvmlSource(fake, xid_wait_ms=50)


def joined(fake: FakeNvml, proc: FakeProc) -> ProcessGpuMap:
    source = open_source(fake)
    join = join_map(proc)
    join.refresh(source)
    source.close()
    return join


def test_parse_of_stat_counts_fields_after_the_last_parenthesis(proc: FakeProc) -> None:
    assert read_parent(proc.root, 301) == 200  # command "a) b (c"
    assert read_parent(proc.root, 200) == 100
    assert read_parent(proc.root, 999) is None


def test_a_worker_its_engine_and_the_api_server_map_to_the_worker_gpu(
    fake_nvml: FakeNvml, proc: FakeProc
) -> None:
    fake_nvml.gpus[0].compute_processes = [(300, 2 * 2**30)]
    join = joined(fake_nvml, proc)
    gpu0 = (fake_nvml.gpus[0].uuid,)
    assert [join.uuids_for_pid(pid) for pid in (300, 200, 100, 10)] == [gpu0] * 4
    assert join.uuids_for_pid(1) == ()  # init is everyone's ancestor: never joined
    assert join.uuids_for_pid(EXPORTER_PID) == ()
    assert join.uuids_for_pid(400) == () and join.uuids_for_pid(301) == ()
    state = join.state()
    assert state.status is ProcessJoin.OK and state.visible == (300,) and state.mapped == 4


def test_the_walk_stops_at_the_exporter_itself(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    # an engine started by the exporter's own process: the exporter is not joined
    proc = FakeProc(tmp_path / "proc", {1: 0, EXPORTER_PID: 1, 60: EXPORTER_PID})
    fake_nvml.gpus[1].compute_processes = [(60, None)]  # memory not available, as on WDDM
    join = joined(fake_nvml, proc)
    assert join.uuids_for_pid(60) == (fake_nvml.gpus[1].uuid,)
    assert join.uuids_for_pid(EXPORTER_PID) == ()


def test_tensor_parallel_workers_join_the_engine_to_both_gpus(
    fake_nvml: FakeNvml, proc: FakeProc
) -> None:
    # the second GPU listed first and its worker also on graphics: sorted, no duplicates
    fake_nvml.gpus[1].compute_processes = [(301, 10 * 2**30)]
    fake_nvml.gpus[1].graphics_processes = [(301, 0)]
    fake_nvml.gpus[0].compute_processes = [(300, 10 * 2**30)]
    join = joined(fake_nvml, proc)
    both = tuple(sorted(g.uuid for g in fake_nvml.gpus))
    assert join.uuids_for_pid(100) == both
    assert join.uuids_for_pid(200) == both
    assert join.uuids_for_pid(300) == (fake_nvml.gpus[0].uuid,)
    assert join.uuids_for_pid(301) == (fake_nvml.gpus[1].uuid,)


def test_a_process_that_exits_leaves_the_map(fake_nvml: FakeNvml, proc: FakeProc) -> None:
    fake_nvml.gpus[0].compute_processes = [(300, 1)]
    fake_nvml.gpus[1].compute_processes = [(301, 1)]
    source = open_source(fake_nvml)
    join = join_map(proc)
    join.refresh(source)
    assert join.uuids_for_pid(100) == tuple(sorted(g.uuid for g in fake_nvml.gpus))
    # 301 exited between NVML's list and the walk: still listed, gone from /proc
    proc.remove(301)
    join.refresh(source)
    assert join.uuids_for_pid(100) == (fake_nvml.gpus[0].uuid,)
    assert join.uuids_for_pid(301) == ()
    assert join.state().status is ProcessJoin.OK and join.state().missing == (301,)
    # then NVML drops it, and the last one exits too
    fake_nvml.gpus[1].compute_processes = []
    fake_nvml.gpus[0].compute_processes = []
    join.refresh(source)
    assert join.uuids_for_pid(100) == () and join.state().status is ProcessJoin.OK
    source.close()


def test_an_engine_whose_parent_exited_mid_walk_keeps_what_was_found(
    fake_nvml: FakeNvml, proc: FakeProc
) -> None:
    proc.remove(100)  # the API server is gone; 200 still names it as parent
    fake_nvml.gpus[0].compute_processes = [(300, 1)]
    join = joined(fake_nvml, proc)
    assert join.uuids_for_pid(200) == (fake_nvml.gpus[0].uuid,)
    assert join.uuids_for_pid(10) == ()


def test_no_permission_is_said_remembered_and_empties_the_map(proc: FakeProc) -> None:
    fake = FakeNvml([fake_gpu(0, compute_processes=[(300, 1)])])
    fake.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    source = open_source(fake)
    join = join_map(proc)
    join.refresh(source)
    state = join.state()
    assert state.status is ProcessJoin.NO_PERMISSION
    assert "no permission" in state.why and fake.gpus[0].uuid in state.why
    assert join.uuids_for_pid(300) == ()
    join.refresh(source)
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1  # not asked again
    source.close()


def test_a_mig_gpu_lists_its_processes_to_root_only(proc: FakeProc) -> None:
    fake = FakeNvml(
        [fake_gpu(0, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, compute_processes=[(300, 1)])]
    )
    join = joined(fake, proc)
    assert join.state().status is ProcessJoin.NO_PERMISSION
    assert "MIG mode: NVML lists the processes of a MIG GPU's instances only to root" in (
        join.state().why
    )
    fake.privileged = True
    join = joined(fake, proc)
    assert join.state().status is ProcessJoin.OK
    assert join.uuids_for_pid(100) == (fake.gpus[0].uuid,)
    assert "MIG mode" in join.state().listing.notes[fake.gpus[0].uuid]


def test_one_gpu_refusing_leaves_the_others_joined(proc: FakeProc) -> None:
    fake = FakeNvml(
        [fake_gpu(0, compute_processes=[(300, 1)]), fake_gpu(1, compute_processes=[(301, 1)])]
    )
    fake.gpus[1].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    join = joined(fake, proc)
    state = join.state()
    assert state.status is ProcessJoin.OK and "not listed" in state.why
    assert fake.gpus[1].uuid in state.listing.refused
    assert join.uuids_for_pid(100) == (fake.gpus[0].uuid,)


def test_graphics_refused_still_lists_compute(proc: FakeProc) -> None:
    fake = FakeNvml([fake_gpu(0, compute_processes=[(300, 1)])])
    fake.gpus[0].errors["nvmlDeviceGetGraphicsRunningProcesses"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = open_source(fake)
    join = join_map(proc)
    join.refresh(source)
    join.refresh(source)
    assert join.uuids_for_pid(100) == (fake.gpus[0].uuid,)
    assert fake.calls["nvmlDeviceGetGraphicsRunningProcesses_v3"] == 1
    source.close()


def test_an_older_driver_falls_back_to_the_version_it_has(proc: FakeProc) -> None:
    fake = FakeNvml([fake_gpu(0, compute_processes=[(300, 1)])])
    fake.missing_functions = {
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
    }
    source = open_source(fake)
    join = join_map(proc)
    join.refresh(source)
    join.refresh(source)
    assert join.uuids_for_pid(100) == (fake.gpus[0].uuid,)
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1  # then _v2 only
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2
    fake.missing_functions |= {
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
    }
    join = joined(fake, proc)  # no version left: the unversioned name raises a mismatch
    assert join.state().status is ProcessJoin.NOT_SUPPORTED
    assert "has no nvmlDeviceGetComputeRunningProcesses function" in join.state().why
    source.close()


def test_a_transient_error_keeps_the_last_list(fake_nvml: FakeNvml, proc: FakeProc) -> None:
    fake_nvml.gpus[0].compute_processes = [(300, 1)]
    source = open_source(fake_nvml)
    join = join_map(proc)
    join.refresh(source)
    fake_nvml.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_UNKNOWN
    join.refresh(source)
    assert join.uuids_for_pid(100) == (fake_nvml.gpus[0].uuid,)
    del fake_nvml.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"]
    fake_nvml.gpus[0].compute_processes = []
    join.refresh(source)
    assert join.uuids_for_pid(100) == ()
    source.close()


def test_pids_of_another_pid_namespace_are_said_and_not_joined(
    fake_nvml: FakeNvml, proc: FakeProc
) -> None:
    # host pids, as NVML reports them, seen from a container without hostPID
    fake_nvml.gpus[0].compute_processes = [(31234, 1)]
    fake_nvml.gpus[1].compute_processes = [(31235, 1)]
    join = joined(fake_nvml, proc)
    state = join.state()
    assert state.status is ProcessJoin.OTHER_PID_NAMESPACE
    assert "31234, 31235" in state.why and "hostPID" in state.why
    assert state.mapped == 0 and join.uuids_for_pid(31234) == ()


def test_a_lost_gpu_is_left_out_and_a_driver_failure_keeps_the_last_map(
    fake_nvml: FakeNvml, proc: FakeProc
) -> None:
    fake_nvml.gpus[0].compute_processes = [(300, 1)]
    fake_nvml.gpus[1].compute_processes = [(301, 1)]
    source = open_source(fake_nvml)
    poller = GpuPoller(source, 1.0, processes=join_map(proc), process_interval_s=0.0)
    poller.poll_once()
    assert len(poller.processes.uuids_for_pid(100)) == 2
    fake_nvml.gpus[1].lost = True
    poller.poll_once()
    assert poller.processes.uuids_for_pid(100) == (fake_nvml.gpus[0].uuid,)
    fake_nvml.driver_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    poller.poll_once()  # sample() fails and NVML goes down; the listing fails too
    assert poller.processes.uuids_for_pid(100) == (fake_nvml.gpus[0].uuid,)
    assert poller.processes.state().status is ProcessJoin.OK
    fake_nvml.driver_error = None
    poller.stop()


class NoLister:
    name = "plain"

    def devices(self) -> list[GpuDevice]:
        return [GpuDevice(0, "GPU-x", "x", "0:0:0.0")]

    def sample(self) -> list[GpuReading]:
        return [GpuReading(0, "GPU-x")]

    def close(self) -> None:
        pass


class ManualTimer:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_poller_lists_in_its_first_round_then_at_the_process_interval(
    fake_nvml: FakeNvml, proc: FakeProc
) -> None:
    timer = ManualTimer()
    poller = GpuPoller(
        open_source(fake_nvml), 1.0, timer=timer, processes=join_map(proc), process_interval_s=5.0
    )
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))

    def status(state: str) -> float | None:
        return registry.get_sample_value("gpuscope_gpu_process_join_status", {"status": state})

    assert poller.processes.state().status is ProcessJoin.PENDING
    fake_nvml.gpus[0].compute_processes = [(300, 1)]
    poller.poll_once()
    assert (status("ok"), status("pending"), status("no_permission")) == (1.0, 0.0, 0.0)
    assert registry.get_sample_value("gpuscope_gpu_process_join_processes") == 1.0
    assert poller.processes.uuids_for_pid(100) == (fake_nvml.gpus[0].uuid,)
    fake_nvml.gpus[0].compute_processes = [(300, 1), (301, 1)]
    timer.now += 4.0
    poller.poll_once()  # not due yet: the map is the first round's
    assert poller.processes.uuids_for_pid(301) == ()
    timer.now += 1.0
    poller.poll_once()
    assert poller.processes.uuids_for_pid(301) == (fake_nvml.gpus[0].uuid,)
    assert registry.get_sample_value("gpuscope_gpu_process_join_processes") == 2.0
    assert fake_nvml.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 4  # 2 GPUs x 2
    poller.stop()


def test_a_source_that_cannot_list_processes_says_so() -> None:
    poller = GpuPoller(NoLister(), 1.0)
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    poller.poll_once()
    state = poller.processes.state()
    assert state.status is ProcessJoin.NOT_SUPPORTED and "plain" in state.why
    labels = {"status": "not_supported"}
    assert registry.get_sample_value("gpuscope_gpu_process_join_status", labels) == 1.0
    assert registry.get_sample_value("gpuscope_gpu_process_join_processes") == 0.0
    assert ProcessGpuMap().state().status is ProcessJoin.NO_GPU_SOURCE


def test_scenario_process_events_validate() -> None:
    event = parse_scenario({"events": [{"gpu": 1, "fault": "process", "pid": 7}]}).events[0]
    assert (event.fault, event.gpu, event.pid) == ("process", 1, 7)
    for bad in (
        {"fault": "process"},
        {"fault": "process", "pid": 0},
        {"fault": "process", "pid": "7"},
    ):
        with pytest.raises(ScenarioError, match="'pid' must be a positive integer"):
            parse_scenario({"events": [bad]})


@pytest.fixture
def engine_tree() -> Iterator[tuple[int, int]]:
    """A real process (the "API server") with one child (the "worker"): (parent, child)."""
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        try:
            yield parent.pid, child
        finally:
            os.kill(child, signal.SIGKILL)  # the parent's child: ours to end, by its pid
            parent.kill()


def test_simulated_gpus_join_a_real_process_tree(engine_tree: tuple[int, int]) -> None:
    api_server, worker = engine_tree
    now = [1000.0]
    scenario = parse_scenario(
        {"events": [{"at": 0, "duration": 10, "gpu": 1, "fault": "process", "pid": worker}]}
    )
    source = SimulatedSource(2, scenario, clock=lambda: now[0])
    poller = GpuPoller(source, 1.0, process_interval_s=0.0)  # the real /proc, this pid
    poller.poll_once()
    assert poller.processes.uuids_for_pid(api_server) == (simulated_uuid(1),)
    assert poller.processes.uuids_for_pid(worker) == (simulated_uuid(1),)
    assert poller.processes.uuids_for_pid(os.getpid()) == ()  # the exporter: never
    assert poller.processes.uuids_for_pid(os.getppid()) == ()  # above it: never reached
    now[0] += 10  # the scenario's process ends
    poller.poll_once()
    assert poller.processes.uuids_for_pid(api_server) == ()
    poller.stop()


def server_span(resource: dict[str, str | int]) -> ReadableSpan:
    """A gpuscope server span without a GPU UUID, from a process named on its resource."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm", **resource}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    span = provider.get_tracer(contract.INSTRUMENTATION_NAME).start_span(
        "POST /v1/completions",
        kind=SpanKind.SERVER,
        attributes={
            contract.HTTP_ROUTE: "/v1/completions",
            contract.HTTP_RESPONSE_STATUS_CODE: 200,
        },
        start_time=T0,
    )
    span.end(end_time=T0 + 50_000_000)
    return memory.get_finished_spans()[-1]


def joined_gpus(aggregator: SpanAggregator) -> list[tuple[str, str]]:
    uuid, gpu = REQUEST_DURATION.labels.index("uuid"), REQUEST_DURATION.labels.index("gpu")
    return sorted((labels[uuid], labels[gpu]) for labels, _ in aggregator.duration.items())


@pytest.mark.parametrize("key", ["process.pid", "vllm.process_id"])
def test_the_aggregator_joins_an_api_servers_spans_to_its_workers_gpu(
    engine_tree: tuple[int, int], key: str
) -> None:
    """The interface end to end: the poller's map is what the span aggregator asks."""
    api_server, worker = engine_tree
    events = [{"gpu": 1, "fault": "process", "pid": worker}]
    source = SimulatedSource(2, parse_scenario({"events": events}))
    poller = GpuPoller(source, 1.0)
    poller.poll_once()
    aggregator = SpanAggregator(uuids_for_pid=poller.processes.uuids_for_claim)
    aggregator.set_gpu_devices(source.devices())
    # setup_tracing() puts the pid as an int, vLLM its process_id as a string
    pid: str | int = api_server if key == "process.pid" else str(api_server)
    result = aggregator.ingest(encode([server_span({key: pid})]))
    assert result.aggregated == 1
    assert joined_gpus(aggregator) == [(simulated_uuid(1), "1")]
    poller.stop()


def test_a_tensor_parallel_engine_is_left_to_the_per_host_join(
    engine_tree: tuple[int, int],
) -> None:
    api_server, worker = engine_tree
    events = [{"gpu": "all", "fault": "process", "pid": worker}]  # one pid shown on both
    source = SimulatedSource(2, parse_scenario({"events": events}))
    poller = GpuPoller(source, 1.0)
    poller.poll_once()
    assert len(poller.processes.uuids_for_pid(api_server)) == 2
    aggregator = SpanAggregator(uuids_for_pid=poller.processes.uuids_for_claim)
    aggregator.set_gpu_devices(source.devices())
    aggregator.ingest(encode([server_span({"process.pid": api_server})]))
    assert joined_gpus(aggregator) == [("", "")]
    poller.stop()


def test_doctor_says_why_the_join_fails_and_what_happens_instead(proc: FakeProc) -> None:
    fake = FakeNvml([fake_gpu(0, compute_processes=[(300, 1)]), fake_gpu(1, architecture=AMPERE)])
    fake.gpus[0].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    fake.gpus[1].errors["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    report = diagnose(open_source(fake), proc_root=proc.root)
    join = report["process_join"]
    assert join["status"] == "no_permission" and join["processes"] == 0
    assert join["gpus"][fake.gpus[0].uuid]["listed"] is False
    assert "per-host join" in join["fallback"]
    out = io.StringIO()
    assert run(open_source(fake), DoctorConfig(), out) == 0
    text = out.getvalue()
    assert "GPU process join: no_permission" in text
    assert "GPU 0  " + fake.gpus[0].uuid + ": not listed: no permission" in text
    assert "otherwise: requests whose spans carry no GPU UUID" in text


def test_doctor_lists_the_processes_it_joins(proc: FakeProc) -> None:
    fake = FakeNvml([fake_gpu(0, compute_processes=[(300, 1)]), fake_gpu(1)])
    report = diagnose(open_source(fake), proc_root=proc.root)
    join = report["process_join"]
    assert (join["status"], join["processes"]) == ("ok", 1)
    assert join["gpus"][fake.gpus[0].uuid]["pids"] == [300]
    entry = dict(join["gpus"][fake.gpus[1].uuid])
    entry.pop("numa")  # the GPU's NUMA side: tests/exporter/gpu/test_gpu_cnvml_numa.py
    assert entry == {
        "index": 1,
        "gpu": "1",
        "pids": [],
        "listed": True,
        "why": None,
        "note": None,
    }


def test_doctor_without_a_gpu_source_says_no_gpu_source() -> None:
    report = no_source_report(DoctorConfig(), ["nvmlInit failed"])
    assert report["process_join"]["status"] == "no_gpu_source"
    assert report["process_join"]["gpus"] == {}
