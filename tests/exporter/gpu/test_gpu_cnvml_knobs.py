"""The C fake NVML as the real pynvml sees it: each profile value and fault knob of
``tests/support/cnvml/fake_nvml.c`` answered through pynvml's own ctypes layer (symbol
lookup, versioned structs, strides, error mapping), one subprocess per scenario, under
the lowest nvidia-ml-py the project declares and the newest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.cnvml import library, profiles

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

RELEASES = (library.PYNVML_FLOOR, library.PYNVML_NEWEST)
# NVML_ERROR_* values of nvml.h
NOT_SUPPORTED = 3
TIMEOUT, FUNCTION_NOT_FOUND, GPU_IS_LOST, LIB_RM_VERSION_MISMATCH, UNKNOWN = 10, 13, 15, 18, 999
PRELUDE = """
import json, math, time
import pynvml as n
out = {"pynvml": getattr(n, "__version__", "?")}
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
def err(call):
    try:
        return call()
    except n.NVMLError as exc:
        return f"error:{exc.value}"  # NVML_ERROR_* numbers (nvml.h)
"""


@pytest.fixture(scope="module")
def h200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("h200")
    return profiles.profile_from_capture(profiles.capture("nvidia-h200__590")).write(
        folder / "h200.profile"
    )


def run(profile: Path, body: str, *, release: str, branch: int = 580, **knobs: str) -> Any:
    env = library.environment(profile, branch=branch, pynvml=release, knobs=knobs)
    done = library.run_python(PRELUDE + body + "\nprint(json.dumps(out))", env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("release", RELEASES)
def test_the_profile_answers_through_the_real_pynvml(h200: Path, release: str) -> None:
    out = run(
        h200,
        """
out["name"] = n.nvmlDeviceGetName(h)
out["uuid"] = n.nvmlDeviceGetUUID(h)
m = n.nvmlDeviceGetMemoryInfo(h)
out["v1"] = [m.total, m.used]
m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
out["v2"] = [m2.total, m2.used, m2.reserved]
out["sm"] = [n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
             n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)]
out["limit_mw"] = n.nvmlDeviceGetEnforcedPowerLimit(h)
out["link"] = [n.nvmlDeviceGetCurrPcieLinkGeneration(h), n.nvmlDeviceGetCurrPcieLinkWidth(h)]
out["bus"] = n.nvmlDeviceGetPciInfo(h).busId
out["driver"] = n.nvmlSystemGetDriverVersion()
""",
        release=release,
    )
    mib = 2**20
    # the capture's values: memory.total 143771 MiB, reserved 614 MiB, used 0 MiB;
    # v1 counts reserved as used, v2 keeps it apart
    assert out["name"] == "NVIDIA H200"
    assert out["v2"] == [143771 * mib, 0, 614 * mib]
    assert out["v1"] == [143771 * mib, 614 * mib]
    assert out["sm"] == [345, 1980]
    assert out["limit_mw"] == 700_000
    assert out["link"] == [5, 16]
    assert out["bus"] in ("00000000:83:00.0", b"00000000:83:00.0")
    assert out["driver"] == "590.48.01"


@pytest.mark.parametrize("release", RELEASES)
def test_an_older_branch_lacks_its_entry_points_as_symbols(h200: Path, release: str) -> None:
    body = """
out["events"] = err(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
out["throttle"] = err(lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
out["numa"] = "absent-in-pynvml"
if hasattr(n, "nvmlDeviceGetNumaNodeId"):
    out["numa"] = err(lambda: n.nvmlDeviceGetNumaNodeId(h))
"""
    old = run(h200, body, release=release, branch=535)
    assert old["throttle"] == 1  # the capture's clocks_event_reasons.active 0x1 (GPU idle)
    if release == library.PYNVML_FLOOR:
        assert old["numa"] == "absent-in-pynvml"  # nvmlDeviceGetNumaNodeId came in 12.550
    else:
        assert old["numa"] == f"error:{FUNCTION_NOT_FOUND}"  # the R535 library lacks it


@pytest.mark.parametrize("release", RELEASES)
def test_the_pcie_byte_fields_exist_from_r555(h200: Path, release: str) -> None:
    body = """
values = n.nvmlDeviceGetFieldValues(h, [197, 198])
out["returns"] = [v.nvmlReturn for v in values]
"""
    assert run(h200, body, release=release, branch=550)["returns"] == [2, 2]  # NOT_SUPPORTED
    assert run(h200, body, release=release, branch=555)["returns"] == [0, 0]


@pytest.mark.parametrize("release", RELEASES)
def test_a_hung_call_blocks_the_caller(h200: Path, release: str) -> None:
    out = run(
        h200,
        """
t = time.monotonic(); n.nvmlDeviceGetPowerUsage(h); out["first"] = time.monotonic() - t
time.sleep(0.3)
t = time.monotonic(); n.nvmlDeviceGetPowerUsage(h); out["hung"] = time.monotonic() - t
""",
        release=release,
        HANG="nvmlDeviceGetPowerUsage:after_s=0.2:for_s=1",
    )
    assert out["first"] < 0.2 and 0.9 < out["hung"] < 5


@pytest.mark.parametrize("release", RELEASES)
def test_a_lost_gpu_and_a_bad_handle_answer_as_a_driver_does(h200: Path, release: str) -> None:
    lost = run(
        h200,
        """
out["before"] = err(lambda: n.nvmlDeviceGetTemperature(h, 0))
time.sleep(0.3)
out["after"] = err(lambda: n.nvmlDeviceGetTemperature(h, 0))
""",
        release=release,
        LOST="0:after_s=0.2",
    )
    assert lost == {"pynvml": lost["pynvml"], "before": 28, "after": f"error:{GPU_IS_LOST}"}
    for code, error in (
        ("NO_PERMISSION", "4"),
        ("INSUFFICIENT_POWER", "8"),
        ("IRQ_ISSUE", "11"),
    ):
        env = library.environment(h200, pynvml=release, knobs={"BAD_HANDLE": f"0:{code}"})
        code_run = (
            "import pynvml as n\nn.nvmlInit()\n"
            "try:\n n.nvmlDeviceGetHandleByIndex(0)\nexcept n.NVMLError as e:\n print(e.value)"
        )
        assert library.run_python(code_run, env).stdout.strip() == error


@pytest.mark.parametrize("release", RELEASES)
def test_events_deliver_xids_and_fail_for_a_lost_gpu(h200: Path, release: str) -> None:
    out = run(
        h200,
        """
s = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, s)
data = n.nvmlEventSetWait_v2(s, 1000)
out["xid"] = [data.eventType, data.eventData]
out["idle"] = err(lambda: n.nvmlEventSetWait_v2(s, 50))
time.sleep(0.6)
out["lost"] = err(lambda: n.nvmlEventSetWait_v2(s, 100))
""",
        release=release,
        XIDS="0:79:at_s=0.0",
        LOST="0:after_s=0.5",
    )
    assert out["xid"] == [8, 79]
    assert out["idle"] == f"error:{TIMEOUT}"  # no event within the wait
    assert out["lost"] == f"error:{GPU_IS_LOST}"


@pytest.mark.parametrize("release", RELEASES)
def test_event_set_creation_can_fail(h200: Path, release: str) -> None:
    out = run(
        h200,
        'out["create"] = err(lambda: n.nvmlEventSetCreate())',
        release=release,
        ERRORS="nvmlEventSetCreate:UNKNOWN",
    )
    assert out["create"] == f"error:{UNKNOWN}"


def test_the_32_byte_process_stride_garbles_what_pynvml_reads(h200: Path) -> None:
    # pynvml 13.615.71 reads 24-byte _v3 records; a driver writing 32 bytes shifts them
    body = """
out["pids"] = [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
"""
    listed = "gpu.0.processes.compute=301:1048576 302:2097152 303:3145728"
    right = run(h200, body, release=library.PYNVML_NEWEST, SET=listed)
    wrong = run(h200, body, release=library.PYNVML_NEWEST, PROCESS_STRIDE="32", SET=listed)
    assert right["pids"] == [301, 302, 303]
    assert wrong["pids"] != right["pids"] and wrong["pids"][0] == 301
    assert set(wrong["pids"][1:]) & {0, 4294967295}


@pytest.mark.parametrize("release", RELEASES)
def test_gpm_nan_and_a_version_mismatch(h200: Path, release: str) -> None:
    body = """
def gpm():
    a = n.nvmlGpmSampleAlloc(); b = n.nvmlGpmSampleAlloc()
    n.nvmlGpmSampleGet(h, a); time.sleep(0.11); n.nvmlGpmSampleGet(h, b)
    g = n.c_nvmlGpmMetricsGet_t()
    g.version = n.NVML_GPM_METRICS_GET_VERSION
    g.numMetrics = 1
    g.sample1 = a; g.sample2 = b
    g.metrics[0].metricId = 3
    n.nvmlGpmMetricsGet(g)
    return g.metrics[0].value
out["occupancy"] = str(gpm())
"""
    assert run(h200, body, release=release)["occupancy"] == "0.0"
    assert run(h200, body, release=release, GPM_NAN="1")["occupancy"] == "nan"
    env = library.environment(h200, pynvml=release, knobs={"RM_MISMATCH": "0"})
    code = "import pynvml as n\ntry:\n n.nvmlInit()\nexcept n.NVMLError as e:\n print(e.value)"
    assert library.run_python(code, env).stdout.strip() == str(LIB_RM_VERSION_MISMATCH)


def test_every_capture_converts_to_a_profile_the_fake_loads() -> None:
    for path in profiles.captures():
        profile = profiles.profile_from_capture(path)
        values = profile.values()
        assert int(values["device_count"]) >= 1, path.name
        assert values["gpu.0.name"].startswith("NVIDIA"), path.name
        assert "gpu.0.memory.total_bytes" in values, path.name


@pytest.mark.parametrize(
    ("branch", "release"), [(535, library.PYNVML_FLOOR), (580, library.PYNVML_NEWEST)]
)
def test_the_hardware_scripts_driver_facts_tell_the_branches_apart(
    h200: Path, branch: int, release: str
) -> None:
    # scripts/gpu-check records these on a lent GPU; here the fake's branches stand in
    scripts = Path(__file__).resolve().parents[3] / "scripts"
    code = (
        f"import json, sys; sys.path.insert(0, {str(scripts)!r})\n"
        "import pynvml\nfrom gpu_validation import driver_facts\n"
        "pynvml.nvmlInit()\nprint(json.dumps(driver_facts(pynvml, 0)))"
    )
    done = library.run_python(code, library.environment(h200, branch=branch, pynvml=release))
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    points = facts["entry_points"]
    assert facts["driver_version"] == "590.48.01"
    assert points["nvmlDeviceGetCurrentClocksEventReasons"] is (branch >= 535)
    assert points["nvmlDeviceGetNumaNodeId"] is (branch >= 550)
    assert facts["pcie_byte_fields"] == [branch >= 555] * 2
    # v1 counts the 614 MiB reserved as used; v2 keeps it apart
    assert facts["memory_v1_used_bytes"] - facts["memory_v2_used_bytes"] == 614 * 2**20
    assert facts["memory_v2_reserved_bytes"] == 614 * 2**20


@pytest.mark.parametrize("release", RELEASES)
def test_the_nvml_probe_records_the_fakes_answers(h200: Path, release: str) -> None:
    """``scripts/nvml-probe`` (also run inside ``scripts/gpu-check``) records each call's
    answer or error code: under the fake, the h200 capture's idle values."""
    probe = Path(__file__).resolve().parents[3] / "scripts" / "nvml-probe"
    env = library.environment(h200, pynvml=release)
    done = subprocess.run(
        [sys.executable, str(probe), "--repeat", "1"], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = json.loads(done.stdout)["calls"]
    values = {label: answer.get("value", answer.get("error")) for label, answer in calls.items()}
    assert values["name"] == "NVIDIA H200"
    assert values["sm_clock"] == 345 and values["sm_clock_max"] == 1980
    assert values["memory_clock"] == 3201
    assert values["power_mw"] == 77710 and values["power_limit_mw"] == 700000
    assert values["temperature"] == 28
    assert (values["pcie_link_generation"], values["pcie_link_width"]) == (5, 16)
    assert values["clock_event_reasons"] == 1  # gpu_idle, 0x1 in the capture
    assert values["memory_v1"]["used"] == 614 * 2**20  # v1 counts the reserved memory
    if release == library.PYNVML_FLOOR:  # its pynvml has no wrapper for the call
        assert calls["numa_node"] == {"absent_from_pynvml": True}
    else:
        assert values["numa_node"] == NOT_SUPPORTED  # "GPU NUMA ID N/A" in the capture
    assert values["compute_processes"] == []
    assert all("median_ms" in answer for answer in calls.values() if "value" in answer)


def test_the_nvml_probe_without_a_library_or_with_a_missing_gpu_exits_2(h200: Path) -> None:
    probe = Path(__file__).resolve().parents[3] / "scripts" / "nvml-probe"
    no_library = {k: v for k, v in library.environment(h200).items() if k != "LD_LIBRARY_PATH"}
    for env, why in (
        (no_library, "cannot load NVML"),
        (library.environment(h200), "--gpu 3: only 1 GPUs present"),
    ):
        done = subprocess.run(
            [sys.executable, str(probe), "--gpu", "3"], env=env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2 and why in done.stderr, done.stderr
        assert done.stdout == ""
