"""PCIe traffic as byte counters, by the best way the driver and GPU give.

1. ``fields``: the driver's cumulative counters ``NVML_FI_DEV_PCIE_COUNT_TX_BYTES`` /
   ``RX_BYTES`` (field ids 197/198, drivers R555 and newer) through
   ``nvmlDeviceGetFieldValues``: exact, and one cheap call. On a real H200 with driver
   580.159.04 they count modulo 2^32 (they rose to 4.29e9 and began again, so a copy
   of 2 GiB read as -1.98e9 bytes), whatever value type they are given in: each
   reading is taken as the distance from the previous one modulo 2^32 and added up,
   which is exact while less than 4 GiB crosses the link between two polls (at PCIe 5
   x16's ~55 GB/s, about 70 ms of full traffic: a poll interval under that, or GPM's
   rates, would be needed to count a link kept full).
2. ``gpm``: where the fields are missing and the GPU has GPM (Hopper and newer), GPM's
   PCIe rates (``NVML_GPM_METRIC_PCIE_TX/RX_PER_SEC``, MiB/s averaged between two GPM
   samples), integrated by ``gpm.GpmSampler`` over each sample interval: every byte of
   the interval is in the average, so only rounding is lost.
3. ``sampled``: elsewhere (Ampere, Ada on R535/R550), ``nvmlDeviceGetPcieThroughput``,
   which blocks 20 ms per call and returns one direction's KB/s over those 20 ms. A
   thread of its own (``PcieThroughputSampler``) calls it every ``SAMPLE_PERIOD_S``
   and integrates each sample over the time since the previous one; the poll reads
   the latest totals and never waits on those calls. It is an estimate: traffic
   between two 20 ms windows is assumed to run at the rate last seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuscope.exporter.gpu.nvml.errors import NvmlErrorKind, classify
from gpuscope.exporter.gpu.nvml.gpm import GpmSampler

log = logging.getLogger(__name__)

# nvml.h: #define NVML_FI_DEV_PCIE_COUNT_TX_BYTES 197, #define NVML_FI_DEV_PCIE_COUNT_RX_BYTES
# 198. pynvml has the names from 12.555 only; the driver, not pynvml, decides whether the
# fields exist, so the ids are used where the names are missing.
PCIE_TX_FIELD = 197
PCIE_RX_FIELD = 198
SAMPLE_PERIOD_S = 1.0  # between two throughput samples of the sampling thread
KIB = 1024.0  # nvmlDeviceGetPcieThroughput's "KB/s" are KiB/s (NVIDIA's samples divide by 1024)

# A field entry's nvmlReturn that means this driver or device lacks the field
# (INVALID_ARGUMENT: an id the driver does not know).
_FIELDS_MISSING = (
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
)

# c_nvmlValue_t member for each NVML_VALUE_TYPE_*
_VALUE_MEMBER = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}

FIELDS, GPM, SAMPLED = "fields", "gpm", "sampled"
FIELD_MODULUS = 1 << 32  # what the driver's PCIe byte fields count modulo (module doc)
NOTES = {
    GPM: (
        "GPM's PCIe rates (MiB/s averaged between two GPM samples) integrated over each "
        "interval: this driver lacks the byte-count fields 197/198 (R555 and newer have them)"
    ),
    SAMPLED: (
        "estimated: this driver lacks the byte-count fields 197/198 (R555+) and the GPU "
        "GPM's PCIe rates (Hopper+), so a thread of its own samples nvmlDeviceGetPcieThroughput "
        "(a rate over 20 ms) every {period:g} s and integrates it; bursts between samples "
        "are missed"
    ),
}


def field_value(nvml: Any, entry: Any) -> float | None:
    """The value of one ``c_nvmlFieldValue_t``, or None when its own return is an error."""
    if entry.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    member = _VALUE_MEMBER.get(entry.valueType)
    return None if member is None else float(getattr(entry.value, member))


class PcieByteCounter:
    """(tx_bytes, rx_bytes) counters for one device; ``method`` says how (module doc)."""

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        gpm: GpmSampler | None = None,
        *,
        sample_period_s: float | None = None,
    ) -> None:
        self._nvml = nvml
        self._handle = handle
        self._gpm = gpm
        self._period_s = SAMPLE_PERIOD_S if sample_period_s is None else sample_period_s
        self.method = FIELDS
        self._sampler: PcieThroughputSampler | None = None
        # per direction: the last raw field reading and the total grown from it
        self._raw: list[float] | None = None
        self._totals = [0.0, 0.0]

    @property
    def note(self) -> str | None:
        """How the counters are obtained, when not from the exact fields."""
        if self.method == FIELDS:
            return None
        return NOTES[self.method].format(period=self._period_s)

    def read(self, *, gpm_usable: bool = True) -> tuple[float, float] | None:
        """The counters; None while the chosen method has no value yet.

        Raises the NVMLError of the fields or the throughput calls (classified by the
        caller); only missing fields change the method, for good.
        """
        if self.method == FIELDS:
            counters = self._from_fields()
            if counters is not None:
                return counters
            self.method = GPM if self._gpm is not None and gpm_usable else SAMPLED
            if self._gpm is not None and self.method == GPM:
                self._gpm.track_pcie()
        if self.method == GPM:
            gpm = self._gpm
            if gpm is not None and gpm_usable and gpm.pcie_refused is None:
                return gpm.pcie_totals
            self.method = SAMPLED  # GPM answered NotSupported for its PCIe metrics
        if self._sampler is None:
            self._sampler = PcieThroughputSampler(self._nvml, self._handle, period_s=self._period_s)
            self._sampler.start()
        return self._sampler.read()

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    def _from_fields(self) -> tuple[float, float] | None:
        nvml = self._nvml
        ids = [
            getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", PCIE_TX_FIELD),
            getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", PCIE_RX_FIELD),
        ]
        try:
            entries = nvml.nvmlDeviceGetFieldValues(self._handle, ids)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return None
        missing = {getattr(nvml, name) for name in _FIELDS_MISSING}
        for entry in entries:
            status = entry.nvmlReturn
            if status in missing:
                return None
            if status != nvml.NVML_SUCCESS:
                # A lost GPU, a driver failure or a one-off error: classified by the
                # caller like any other call's error. Only missing fields mean the
                # estimate, for good, and switching to it would restart the counter.
                raise nvml.NVMLError(status)
        tx, rx = (field_value(nvml, entry) for entry in entries)
        if tx is None or rx is None:
            return None
        return self._unwrapped(tx, rx)

    def _unwrapped(self, tx: float, rx: float) -> tuple[float, float]:
        """Totals that only grow from readings that count modulo ``FIELD_MODULUS``."""
        raw = [tx, rx]
        if self._raw is None:
            self._totals = [tx, rx]
        else:
            for index, (now, before) in enumerate(zip(raw, self._raw, strict=True)):
                self._totals[index] += (now - before) % FIELD_MODULUS
        self._raw = raw
        return self._totals[0], self._totals[1]


class PcieThroughputSampler:
    """``nvmlDeviceGetPcieThroughput`` on a thread of its own, integrated into totals.

    The poll calls ``read()``: the latest totals, or the error the last sample met
    (raised once, for the caller to classify). An error that means the GPU cannot give
    the rate (NotSupported, ...) ends the thread; ``close()`` ends it in any case and
    waits for the call in flight (20 ms).
    """

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        *,
        period_s: float = SAMPLE_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._handle = handle
        self._period_s = period_s
        self._clock = clock
        self._lock = threading.Lock()
        self._totals = [0.0, 0.0]
        self._last_at: float | None = None
        self._error: BaseException | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="gpuscope-pcie-throughput", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 2 * self._period_s))
            self._thread = None

    def read(self) -> tuple[float, float] | None:
        with self._lock:
            error, self._error = self._error, None
            if error is not None:
                raise error
            return None if self.samples == 0 else (self._totals[0], self._totals[1])

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sample_once():
                return
            self._stop.wait(self._period_s)

    def sample_once(self) -> bool:
        """One pair of 20 ms samples; False when the GPU cannot give them (stop)."""
        nvml = self._nvml
        try:
            tx = nvml.nvmlDeviceGetPcieThroughput(self._handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = nvml.nvmlDeviceGetPcieThroughput(self._handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        except nvml.NVMLError as exc:
            with self._lock:
                self._error = exc
                self._last_at = None  # no bytes are invented over a gap
            return classify(nvml, exc) is not NvmlErrorKind.UNSUPPORTED
        now = self._clock()
        with self._lock:
            if self._last_at is not None:
                elapsed = max(0.0, now - self._last_at)
                self._totals[0] += tx * KIB * elapsed
                self._totals[1] += rx * KIB * elapsed
            self._last_at = now
            self.samples += 1
        return True
