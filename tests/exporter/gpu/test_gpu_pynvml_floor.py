"""The NVML modules against the lowest nvidia-ml-py the project declares (12.535.77).

That release lacks names the newest has (``NVML_FI_DEV_PCIE_COUNT_*`` from 12.555,
``nvmlDeviceGetNumaNodeId`` and ``NVMLLibraryMismatchError`` from 12.550, the ``_v2``
process calls, ``c_nvmlProcessInfo_v3_t``), and reads 32-byte process records. The
real module file is loaded from ``make pynvml-versions``' install (not imported as
``pynvml``, which stays the newest); the fake of the driver then hands out its
constants, errors and structs and lacks every function it lacks.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from gpuscope.exporter.gpu.nvml.device import NvmlDeviceReader
from gpuscope.exporter.gpu.source import GpuDevice
from support.gpu_fake_nvml import AMPERE, FakeNvml, fake_gpu

REPO = Path(__file__).resolve().parents[3]
FLOOR = "12.535.77"
FLOOR_FILE = REPO / ".venv" / "pynvml" / FLOOR / "pynvml.py"
NVML_PACKAGE = REPO / "exporter" / "gpu" / "nvml"
# the modules of this package's readers that touch pynvml (source, events and errors
# are covered by their own tests)
MODULES = [NVML_PACKAGE / f"{name}.py" for name in ("device", "gpm", "pcie", "processes")]
RECEIVERS = {"nvml", "n"}  # the names the injected module goes by in those files


@pytest.fixture(scope="module")
def floor() -> ModuleType:
    if not FLOOR_FILE.is_file():
        pytest.skip(
            f"nvidia-ml-py {FLOOR} is not installed in {FLOOR_FILE.parent}: make pynvml-versions"
        )
    spec = importlib.util.spec_from_file_location(f"pynvml_{FLOOR.replace('.', '_')}", FLOOR_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pynvml finds itself there to add its error classes
    spec.loader.exec_module(module)
    return module


def references(path: Path) -> tuple[set[str], set[str]]:
    """(names read directly off the pynvml module, names only probed for) in ``path``.

    Direct: ``nvml.X`` / ``n.X`` / ``self._nvml.X``, and the pynvml-looking string
    constants of the file (``getattr(nvml, constant)`` over a table). Probed: a string
    given to ``hasattr`` or to ``getattr`` with a default.
    """
    tree = ast.parse(path.read_text())
    direct: set[str] = set()
    probed: set[str] = set()
    literals: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id in RECEIVERS) or (
                isinstance(owner, ast.Attribute) and owner.attr == "_nvml"
            ):
                direct.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.args[1] if len(node.args) >= 2 else None
            if not isinstance(name, ast.Constant) or not isinstance(name.value, str):
                continue
            if node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3):
                probed.add(name.value)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith(("NVML", "nvml", "c_nvml"))
            and node.value.isidentifier()
        ):
            literals.add(node.value)
    return direct | (literals - probed), probed


def test_every_pynvml_name_the_readers_need_exists_at_the_floor(floor: ModuleType) -> None:
    needed: dict[str, set[str]] = {}
    probed: set[str] = set()
    for path in MODULES:
        direct, optional = references(path)
        for name in direct:
            needed.setdefault(name, set()).add(path.name)
        probed |= optional
    missing = {name: files for name, files in needed.items() if not hasattr(floor, name)}
    assert missing == {}, f"needed without a probe, absent from nvidia-ml-py {FLOOR}: {missing}"
    newest = {name for name in needed if not hasattr(pynvml, name)}
    assert newest == set(), f"absent from the installed nvidia-ml-py: {newest}"
    # the probes are real: at least the names the floor lacks are among them
    assert {"NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVMLLibraryMismatchError"} <= probed
    assert not hasattr(floor, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES")


def device(index: int, name: str) -> GpuDevice:
    return GpuDevice(
        index, f"GPU-{index}", name, f"00000000:{0x18 + index:02X}:00.0", None, "535.183.01"
    )


def read_twice(fake: FakeNvml, index: int, now: float) -> Any:
    handle = fake.nvmlDeviceGetHandleByIndex(index)
    reader = NvmlDeviceReader(fake, device(index, fake.gpus[index].name), handle)
    reader.read(now, {}, True)
    reading = reader.read(now + 1.0, {}, True)
    return reader, reading


def test_the_readers_run_on_the_floor_pynvml(floor: ModuleType) -> None:
    hopper = fake_gpu(0, compute_processes=[(301, 2**30)])
    ampere = fake_gpu(1, architecture=AMPERE, name="NVIDIA A100-SXM4-80GB")
    fake = FakeNvml([hopper, ampere], driver_version="535.183.01", pynvml=floor)
    assert not hasattr(fake, "nvmlDeviceGetNumaNodeId")  # as the floor module lacks it
    fake.nvmlInit()
    reader, reading = read_twice(fake, 0, 100.0)
    assert reader.unsupported == {}, reader.unsupported
    values = reading.values
    # the byte-count fields by their nvml.h ids, which the floor does not name
    assert (values["pcie_transmit_bytes_total"], values["pcie_receive_bytes_total"]) == (1000, 5000)
    assert values["memory_reserved_bytes"] == 512 * 2**20
    assert values["sm_occupancy_ratio"] == pytest.approx(0.3)
    assert reading.clock_event_reasons is not None
    assert reader.processes.pids() == (301,)  # 32-byte records, read as 32 by this pynvml
    ampere_reader, ampere_reading = read_twice(fake, 1, 100.0)
    assert "gpm" in ampere_reader.unsupported and ampere_reading.values["memory_total_bytes"] > 0
    assert ampere_reader.processes.pids() == ()
    reader.close()
    ampere_reader.close()


def test_a_floor_pynvml_on_a_driver_without_v3_process_calls_says_not_supported(
    floor: ModuleType,
) -> None:
    """The floor has no ``_v2`` and its unversioned name is ``_v3``: on a driver that
    lacks ``_v3`` the GPU's list is refused with the reason, not an AttributeError."""
    fake = FakeNvml([fake_gpu(0, compute_processes=[(301, 1)])], pynvml=floor)
    fake.missing_functions |= {
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
    }
    fake.nvmlInit()
    reader, _ = read_twice(fake, 0, 100.0)
    assert reader.processes.pids() is None
    refused = reader.processes.refused
    assert refused is not None and "has no nvmlDeviceGetComputeRunningProcesses" in refused.why
    reader.close()
