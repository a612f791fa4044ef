"""Clock event reasons: the bitmask NVML and DCGM share, decoded into named flags.

``nvmlDeviceGetCurrentClocksEventReasons`` and DCGM's ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``
return the same bits (nvml.h ``nvmlClocksEventReason*``). Each reason becomes one
``gpuscope_gpu_clock_event_active{reason}`` series, 0 or 1.
"""

from __future__ import annotations

# (label value, bit) in nvml.h order
CLOCK_EVENT_REASON_BITS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

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
