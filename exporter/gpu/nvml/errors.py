"""What an ``NVMLError`` means for gpuscope: a metric the device lacks, a lost GPU,
a broken driver, or a one-off failure.

The pynvml module is always the injected one, so the exception classes come from
it (``nvml.NVMLError_NotSupported``), and a fake module works the same way.
"""

from __future__ import annotations

import enum
from typing import Any


class NvmlErrorKind(enum.Enum):
    UNSUPPORTED = "unsupported"  # absent for good on this device: NotSupported, NoPermission, ...
    GPU_LOST = "gpu_lost"  # this GPU is gone: up=0, the others keep reporting
    DRIVER = "driver"  # NVML as a whole is unusable: re-initialise with backoff
    TRANSIENT = "transient"  # skip the metric this round


class GpuLostError(Exception):
    """A GPU answered NVML_ERROR_GPU_IS_LOST."""


class NvmlDriverError(Exception):
    """NVML itself failed (driver unloaded, library mismatch); the source re-initialises."""


_UNSUPPORTED = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")
_DRIVER = (
    "NVMLError_Uninitialized",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibraryNotFound",
    "NVMLError_LibRmVersionMismatch",
)


def classify(nvml: Any, exc: BaseException) -> NvmlErrorKind:
    if isinstance(exc, _classes(nvml, _UNSUPPORTED)):
        return NvmlErrorKind.UNSUPPORTED
    if isinstance(exc, _classes(nvml, ("NVMLError_GpuIsLost",))):
        return NvmlErrorKind.GPU_LOST
    if isinstance(exc, _classes(nvml, _DRIVER)):
        return NvmlErrorKind.DRIVER
    return NvmlErrorKind.TRANSIENT


def unsupported_reason(nvml: Any, exc: BaseException, *, device: str, driver: str) -> str:
    """Why a metric is absent, in words a user can act on."""
    if isinstance(exc, _classes(nvml, ("NVMLError_NoPermission",))):
        return "no permission: NVML needs more privileges for this (root, or an admin setting)"
    if isinstance(exc, _classes(nvml, ("NVMLError_FunctionNotFound",))):
        return f"driver {driver}: its NVML library lacks this function (needs a newer driver)"
    return f"not supported by {device} with driver {driver}"


def _classes(nvml: Any, names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    # an old pynvml may lack a newer error class; skip it rather than fail
    return tuple(getattr(nvml, name) for name in names if hasattr(nvml, name))
