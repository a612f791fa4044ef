"""Clock event reasons: the bitmask NVML and DCGM share, decoded into named flags.

``nvmlDeviceGetCurrentClocksEventReasons`` and DCGM's ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``
return the same bits (nvml.h ``nvmlClocksEventReason*``). Each reason becomes one
``gpuscope_gpu_clock_event_active{reason}`` series, 0 or 1; the reasons and their bits
are the contract's (``gpuscope.contract.gpu.CLOCK_EVENT_REASON_BITS``).
"""

from __future__ import annotations

from gpuscope.contract.gpu import CLOCK_EVENT_REASON_BITS as CLOCK_EVENT_REASON_BITS

CLOCK_EVENT_REASONS: frozenset[str] = frozenset(name for name, _ in CLOCK_EVENT_REASON_BITS)


def decode_clock_event_reasons(mask: int) -> dict[str, bool]:
    """Every known reason mapped to whether its bit is set in ``mask``."""
    return {name: bool(mask & bit) for name, bit in CLOCK_EVENT_REASON_BITS}


def encode_clock_event_reasons(active: set[str] | frozenset[str]) -> int:
    """The bitmask with the bits of ``active`` set; unknown names are a programmer error."""
    unknown = set(active) - CLOCK_EVENT_REASONS
    if unknown:
        raise ValueError(f"unknown clock event reasons: {sorted(unknown)}")
    return sum(bit for name, bit in CLOCK_EVENT_REASON_BITS if name in active)
