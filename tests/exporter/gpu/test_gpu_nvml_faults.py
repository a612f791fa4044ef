"""The NVML source against driver faults a whole-set or whole-source view gets wrong:
one lost GPU in the XID events, one GPU that refuses to open, event sets NVML will not
create, errors that put one GPU down or cannot heal, an old pynvml or driver."""

from __future__ import annotations

import logging
from typing import Any

import pynvml
import pytest

from gpuscope.exporter.gpu.nvml import errors
from gpuscope.exporter.gpu.nvml.events import ThrottledWarnings
from gpuscope.exporter.gpu.nvml.source import NvmlSource, NvmlUnavailable
from support.gpu_fake_nvml import FakeNvml, fake_gpu


def open_source(fake: FakeNvml) -> NvmlSource:
    return NvmlSource(fake, xid_wait_ms=40)


def test_one_lost_gpu_leaves_the_xids_of_the_others_counted(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    assert fake_nvml.wait_events_handled()
    fake_nvml.gpus[1].lost = True
    assert not source.sample()[1].up
    fake_nvml.emit_xid(0, 13)
    fake_nvml.emit_xid(0, 31)
    assert fake_nvml.wait_events_handled()
    assert source.sample()[0].xid_errors_total == {13: 1, 31: 1}
    health = source.collector_health()
    assert health and health[0].success  # the lost GPU is gpu_up's business, not a failure
    source.close()


def test_a_gpu_lost_from_the_xid_side_alone_is_dropped_and_registered_when_back(
    fake_nvml: FakeNvml,
) -> None:
    source = open_source(fake_nvml)
    assert fake_nvml.wait_events_handled()
    fake_nvml.gpus[1].lost = True  # the event thread sees it before any poll does
    assert fake_nvml.wait_events_handled()
    fake_nvml.emit_xid(0, 48)
    assert fake_nvml.wait_events_handled()
    fake_nvml.gpus[1].lost = False
    first, second = source.sample()
    assert first.xid_errors_total == {48: 1} and second.up
    source.close()


def test_repeated_event_wait_failures_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    warnings = ThrottledWarnings(logging.getLogger("test"), 60.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="test"):
        for _ in range(5):
            warnings.warn("waiting failed")
            now[0] += 1.0
        now[0] += 60.0
        warnings.warn("waiting failed")
    levels = [r.levelno for r in caplog.records]
    assert levels.count(logging.WARNING) == 2 and levels.count(logging.DEBUG) == 4


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_INSUFFICIENT_POWER,
             pynvml.NVML_ERROR_IRQ_ISSUE],
)  # fmt: skip
def test_one_gpu_refusing_its_handle_loses_that_gpu_only(code: int) -> None:
    fake = FakeNvml([fake_gpu(0), fake_gpu(1, errors={"nvmlDeviceGetUUID": code})])
    source = open_source(fake)
    assert [d.index for d in source.devices()] == [0]
    assert [r.up for r in source.sample()] == [True]
    assert str(pynvml.NVMLError(code)) in source.unopened_gpus()[1]
    source.close()


def test_doctor_names_the_gpu_that_could_not_be_opened() -> None:
    from gpuscope.exporter import doctor

    fake = FakeNvml(
        [fake_gpu(0), fake_gpu(1, errors={"nvmlDeviceGetUUID": pynvml.NVML_ERROR_IRQ_ISSUE})]
    )
    source = open_source(fake)
    report = doctor.diagnose(source)
    source.close()
    assert "Interrupt Request Issue" in report["unopened_gpus"]["1"]


def test_event_set_creation_failing_costs_the_xids_only() -> None:
    fake = FakeNvml([fake_gpu(0), fake_gpu(1)])
    fake.event_set_error = pynvml.NVML_ERROR_UNKNOWN
    source = open_source(fake)
    readings = source.sample()
    assert [r.up for r in readings] == [True, True]
    assert [r.xid_supported for r in readings] == [False, False]
    assert "cannot create an NVML event set" in source.unsupported_metrics()[0]["xid_errors"]
    source.close()


def test_mig_gpu_without_privileges_says_its_xids_need_privileges() -> None:
    fake = FakeNvml([fake_gpu(0, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE), fake_gpu(1)])
    source = open_source(fake)
    why = source.unsupported_metrics()[0]["xid_errors"]
    assert why.startswith("needs privileges") and "root" in why
    assert "xid_errors" not in source.unsupported_metrics()[1]
    source.close()


def test_event_wait_falls_back_to_the_unversioned_c_function() -> None:
    fake = FakeNvml([fake_gpu(0)])
    fake.wait_v2_missing = True
    source = open_source(fake)
    assert fake.wait_events_handled()
    fake.emit_xid(0, 79)
    assert fake.wait_events_handled()
    assert source.sample()[0].xid_errors_total == {79: 1}
    assert fake.calls["nvmlEventSetWait_v1"] >= 2
    source.close()


def test_the_v1_wait_uses_a_lookup_every_supported_pynvml_has() -> None:
    # the fallback takes the C function through pynvml's private lookup
    assert callable(getattr(pynvml, "_nvmlGetFunctionPointer", None))


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_RESET_REQUIRED, "reset_required"),
        (pynvml.NVML_ERROR_INSUFFICIENT_POWER, "insufficient_power"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "lost"),
    ],
)
def test_a_gpu_hardware_state_puts_that_gpu_down_with_its_reason(code: int, reason: str) -> None:
    fake = FakeNvml([fake_gpu(0), fake_gpu(1)])
    source = open_source(fake)
    fake.gpus[1].errors["nvmlDeviceGetPowerUsage"] = code
    first, second = source.sample()
    assert first.up and (second.up, second.down_reason) == (False, reason)
    del fake.gpus[1].errors["nvmlDeviceGetPowerUsage"]
    assert source.sample()[1].up  # reset, power back: it answers at its index again
    source.close()


def test_a_gpu_answering_unknown_to_everything_is_down() -> None:
    fake = FakeNvml([fake_gpu(0), fake_gpu(1)])
    source = open_source(fake)
    source.sample()
    functions = [name for name in fake.calls if name.startswith("nvmlDevice")]  # all it asks
    fake.gpus[1].errors = dict.fromkeys(functions, pynvml.NVML_ERROR_UNKNOWN)
    first, second = source.sample()
    assert first.up and (second.up, second.down_reason) == (False, "unanswered")
    fake.gpus[1].errors = {}
    assert source.sample()[1].up
    source.close()


def test_lib_rm_version_mismatch_cannot_heal_and_says_restart(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    assert source.unrecoverable() is None
    fake_nvml.driver_error = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    with pytest.raises(NvmlUnavailable):
        source.sample()
    why = source.unrecoverable()
    assert why is not None and "restart" in why
    source.close()


def test_a_driver_that_goes_away_can_heal(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    fake_nvml.driver_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(NvmlUnavailable):
        source.sample()
    assert source.unrecoverable() is None
    source.close()


def test_every_nvml_error_code_of_pynvml_is_classified() -> None:
    codes = {
        name.removeprefix("NVML_ERROR_") for name in dir(pynvml) if name.startswith("NVML_ERROR_")
    }
    assert codes <= errors.ERRORS.keys()
    assert errors.classify(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)) \
        is errors.NvmlErrorKind.UNSUPPORTED  # fmt: skip
    assert errors.is_fatal(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    assert not errors.is_fatal(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))


class OldPynvml(FakeNvml):
    """nvidia-ml-py 12.535 (the declared floor): no nvmlDeviceGetNumaNodeId, and none of
    the error codes 12.560 added."""

    def __getattribute__(self, name: str) -> Any:
        if name == "nvmlDeviceGetNumaNodeId" or name in (
            "NVML_ERROR_GPU_NOT_FOUND", "NVML_ERROR_INVALID_STATE",
            "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", "NVMLError_GpuNotFound",
            "NVMLError_InvalidState", "NVMLError_ResetTypeNotSupported",
        ):  # fmt: skip
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_starts_on_the_oldest_declared_pynvml_without_the_numa_call() -> None:
    fake = OldPynvml([fake_gpu(0)])
    assert not hasattr(fake, "nvmlDeviceGetNumaNodeId")
    source = open_source(fake)
    assert source.devices()[0].numa_node is None
    assert source.sample()[0].up
    source.close()


def test_an_old_driver_without_the_numa_call_leaves_numa_empty() -> None:
    fake = FakeNvml([fake_gpu(0)])
    fake.gpus[0].errors["nvmlDeviceGetNumaNodeId"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    source = open_source(fake)
    assert source.devices()[0].numa_node is None
    source.close()


def test_release_lets_go_of_nvml_and_acquire_takes_it_again(fake_nvml: FakeNvml) -> None:
    source = open_source(fake_nvml)
    fake_nvml.emit_xid(0, 13)
    assert fake_nvml.wait_events_handled()
    source.release()
    assert fake_nvml.refcount == 0 and fake_nvml.event_sets() == 0  # nothing held
    source.acquire()
    assert fake_nvml.refcount == 1
    assert source.sample()[0].xid_errors_total == {13: 1}  # counts survive
    source.close()
