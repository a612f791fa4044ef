"""What an ``NVMLError`` means for gpuscope: a metric the device lacks, a GPU that is
down, a broken driver, or a one-off failure; and whether it can heal in this process.

Every ``NVML_ERROR_*`` code pynvml knows is classified in ``ERRORS`` below, from what
NVIDIA's ``nvml.h`` says of it. The pynvml module is always the injected one, so the
codes come from it (``nvml.NVML_ERROR_GPU_IS_LOST``) and a fake module works the same
way; a code the installed pynvml lacks (``GPU_NOT_FOUND`` and later arrived in 12.560,
after the declared floor 12.535) is skipped, and an unknown code counts as transient.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class NvmlErrorKind(enum.Enum):
    UNSUPPORTED = "unsupported"  # absent for good on this device: NotSupported, NoPermission, ...
    # this GPU is down (lost, reset required, no power, ...): up=0 with the reason, the
    # others keep reporting, and each poll asks for its handle again
    GPU_LOST = "gpu_lost"
    DRIVER = "driver"  # NVML as a whole is unusable: re-initialise with backoff
    TRANSIENT = "transient"  # skip the metric this round


class GpuLostError(Exception):
    """A GPU answered an error that puts it down as a whole (GPU_IS_LOST, RESET_REQUIRED,
    INSUFFICIENT_POWER, ...); ``down_reason(nvml, error.__cause__)`` says which."""


class NvmlDriverError(Exception):
    """NVML itself failed (driver unloaded, library mismatch); the source re-initialises."""


@dataclass(frozen=True)
class ErrorClass:
    """What gpuscope does about one NVML error code, and why."""

    kind: NvmlErrorKind
    # for GPU_LOST: the ``reason`` label of ``gpuscope_gpu_down_reason``
    down_reason: str = ""
    # True: re-initialising NVML in this process cannot help; liveness fails
    fatal: bool = False


_U, _L, _D, _T = (
    NvmlErrorKind.UNSUPPORTED,
    NvmlErrorKind.GPU_LOST,
    NvmlErrorKind.DRIVER,
    NvmlErrorKind.TRANSIENT,
)

# NVML_ERROR_<name> -> class. The comment is what nvml.h says, then why this class.
ERRORS: dict[str, ErrorClass] = {
    # "NVML was not first initialized with nvmlInit()": NVML was shut down under us;
    # nvmlInit again heals it
    "UNINITIALIZED": ErrorClass(_D),
    # "A supplied argument is invalid": a handle made stale by a reset or a MIG change,
    # or a call this device rejects; nothing says it persists
    "INVALID_ARGUMENT": ErrorClass(_T),
    # "The requested operation is not available on target device"
    "NOT_SUPPORTED": ErrorClass(_U),
    # "The current user does not have permission for operation": the same every call
    "NO_PERMISSION": ErrorClass(_U),
    # "Deprecated: Multiple initializations are now allowed through ref counting"
    "ALREADY_INITIALIZED": ErrorClass(_T),
    # "A query to find an object was unsuccessful": this query, this time
    "NOT_FOUND": ErrorClass(_T),
    # "An input argument is not large enough": a list grew between two calls
    "INSUFFICIENT_SIZE": ErrorClass(_T),
    # "A device's external power cables are not properly attached": this GPU is down
    # until someone plugs it in; the others are fine
    "INSUFFICIENT_POWER": ErrorClass(_L, "insufficient_power"),
    # "NVIDIA driver is not loaded": the driver may be loaded again (driver container)
    "DRIVER_NOT_LOADED": ErrorClass(_D),
    # "User provided timeout passed": the idle event wait, or a slow call
    "TIMEOUT": ErrorClass(_T),
    # "NVIDIA Kernel detected an interrupt issue with a GPU": that GPU cannot be used
    "IRQ_ISSUE": ErrorClass(_L, "irq_issue"),
    # "NVML Shared Library couldn't be found or loaded": pynvml loads it again at the
    # next nvmlInit, so a library installed later is found
    "LIBRARY_NOT_FOUND": ErrorClass(_D),
    # "Local version of NVML doesn't implement this function": an older driver
    "FUNCTION_NOT_FOUND": ErrorClass(_U),
    # "infoROM is corrupted": what comes from the infoROM is unusable until it is
    # reflashed; the GPU itself works
    "CORRUPTED_INFOROM": ErrorClass(_U),
    # "The GPU has fallen off the bus or has otherwise become inaccessible"
    "GPU_IS_LOST": ErrorClass(_L, "lost"),
    # "The GPU requires a reset before it can be used again": down until reset; a reset
    # (nvidia-smi -r, the GPU Operator) brings it back at the same index
    "RESET_REQUIRED": ErrorClass(_L, "reset_required"),
    # "The GPU control device has been blocked by the operating system/cgroups": this
    # GPU's device node, as this container sees it
    "OPERATING_SYSTEM": ErrorClass(_L, "blocked_by_os"),
    # "RM detects a driver/library version mismatch": the libnvidia-ml this process
    # loaded is not the kernel module's version (the driver was upgraded under a running
    # exporter). pynvml keeps the library it loaded, so every nvmlInit in this process
    # fails the same way: only a restart (a new container, the new library) heals it
    "LIB_RM_VERSION_MISMATCH": ErrorClass(_D, fatal=True),
    # "An operation cannot be performed because the GPU is currently in use"
    "IN_USE": ErrorClass(_T),
    # "Insufficient memory"
    "MEMORY": ErrorClass(_T),
    # "No data": no sample yet
    "NO_DATA": ErrorClass(_T),
    # "The requested vgpu operation is not available on target device, because ECC is
    # enabled"
    "VGPU_ECC_NOT_SUPPORTED": ErrorClass(_U),
    # "Ran out of critical resources, other than memory"
    "INSUFFICIENT_RESOURCES": ErrorClass(_T),
    # (nvml.h repeats the line above): a clock the device cannot be set to; set calls only
    "FREQ_NOT_SUPPORTED": ErrorClass(_U),
    # "The provided version is invalid/unsupported": the struct version pynvml passes is
    # one this driver does not know. The same pynvml and driver answer the same every
    # call, and a restart changes neither, so that call's metric is absent (not fatal:
    # every other call works)
    "ARGUMENT_VERSION_MISMATCH": ErrorClass(_U),
    # "The requested functionality has been deprecated"
    "DEPRECATED": ErrorClass(_U),
    # "The system is not ready for the request"
    "NOT_READY": ErrorClass(_T),
    # "No GPUs were found" (12.560+): for one GPU's call, that GPU is gone
    "GPU_NOT_FOUND": ErrorClass(_L, "not_found"),
    # "Resource not in correct state to perform requested operation" (12.560+)
    "INVALID_STATE": ErrorClass(_T),
    # "Reset not supported for given device/parameters" (13.x): reset calls only
    "RESET_TYPE_NOT_SUPPORTED": ErrorClass(_U),
    # "An internal driver error occurred": one call, once; a GPU that answers nothing
    # else is put down by the source (see ``NvmlSource``)
    "UNKNOWN": ErrorClass(_T),
}

_TRANSIENT = ErrorClass(_T)


def error_class(nvml: Any, exc: BaseException) -> ErrorClass:
    """The class of an ``NVMLError`` by its code; anything else is transient."""
    code = getattr(exc, "value", None)
    if not isinstance(exc, nvml.NVMLError) or code is None:
        return _TRANSIENT
    for name, known in ERRORS.items():
        if getattr(nvml, f"NVML_ERROR_{name}", None) == code:
            return known
    return _TRANSIENT


def classify(nvml: Any, exc: BaseException) -> NvmlErrorKind:
    return error_class(nvml, exc).kind


def down_reason(nvml: Any, exc: BaseException | None) -> str:
    """The ``reason`` a GPU is down for, from the NVML error that put it down."""
    found = error_class(nvml, exc) if exc is not None else _TRANSIENT
    return found.down_reason or "lost"


def is_fatal(nvml: Any, exc: BaseException | None) -> bool:
    """Whether the error (or the NVML error it was raised from) cannot heal in-process."""
    while exc is not None:
        if error_class(nvml, exc).fatal:
            return True
        exc = exc.__cause__
    return False


def unsupported_reason(nvml: Any, exc: BaseException, *, device: str, driver: str) -> str:
    """Why a metric is absent, in words a user can act on."""
    if isinstance(exc, _classes(nvml, ("NVMLError_NoPermission",))):
        return "no permission: NVML needs more privileges for this (root, or an admin setting)"
    if isinstance(exc, _classes(nvml, ("NVMLError_FunctionNotFound",))):
        return f"driver {driver}: its NVML library lacks this function (needs a newer driver)"
    if isinstance(exc, _classes(nvml, ("NVMLError_ArgumentVersionMismatch",))):
        return (
            f"driver {driver} does not know the struct version this nvidia-ml-py passes "
            "(a newer driver, or an nvidia-ml-py of the driver's branch)"
        )
    if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_DEPRECATED", 26):
        return f"driver {driver}: NVML answers that this is deprecated (no longer kept)"
    if isinstance(exc, _classes(nvml, ("NVMLError_CorruptedInforom",))):
        return f"{device}: its infoROM is corrupted (nvidia-smi -q shows it; reflash to fix)"
    return f"not supported by {device} with driver {driver}"


def _classes(nvml: Any, names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    # an old pynvml may lack a newer error class; skip it rather than fail
    return tuple(getattr(nvml, name) for name in names if hasattr(nvml, name))
