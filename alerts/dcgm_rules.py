"""Recording rules that read NVIDIA dcgm-exporter's ``DCGM_FI_*`` series as gpuscope's GPU side.

A fleet with the GPU Operator already runs dcgm-exporter on every GPU node; these rules
record its fields under the names of ``gpuscope.contract.gpu`` (in base
units, labelled ``source="dcgm-exporter"``), so the GPU board, the verdict and the GPU
alerts read them as they read gpuscope's own exporter, through ``Settings.gpu_sel``.

Read at dcgm-exporter 4.5.3-4.8.2 (``etc/default-counters.csv``, the exposition template
of ``internal/pkg/rendermetrics/render_metrics.go``, the Kubernetes attributes of
``internal/pkg/transformation``); ``tests/fixtures/dcgm-exporter-4.5.3-4.8.2`` holds
expositions shaped as that release writes them.

Labels: dcgm-exporter writes the GPU's UUID as ``UUID`` (``uuid`` with
``--use-old-namespace``), recorded as ``uuid``; its node as ``Hostname`` (``hostname``
from the release after), recorded as ``hostname``; ``gpu``, ``pci_bus_id``, ``device``,
``modelName``, the driver version and the pod's ``pod`` / ``namespace`` / ``container``
stay as they are. A MIG GPU instance keeps ``GPU_I_ID`` and ``GPU_I_PROFILE``, so each
instance is a series of its own.

Three fields are not the gauges or counters gpuscope serves, and are rebuilt:

- ``DCGM_FI_PROF_PCIE_TX_BYTES`` / ``_RX_BYTES`` are rates (bytes per second): the rule
  adds each evaluation's rate times the time since its previous evaluation onto its own
  previous value, a byte counter that ``rate()`` reads. It integrates the rate as
  sampled at the rule's evaluations.
- ``DCGM_FI_DEV_XID_ERRORS`` is the last XID's code, not a count: a change of that code
  to a non-zero one counts one XID (the rule compares the code with the one recorded at
  its previous evaluation). An XID that repeats the previous code, a second XID within
  one evaluation interval, and XIDs while dcgm-exporter or Prometheus is down are not
  counted; a code's first occurrence starts that code's series at 1, which ``increase()``
  of the per-code counter does not see (the all-codes counter, which the alert reads,
  exists from the start and counts it).
- ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` is NVML's bitmask: one 0/1 series per reason, as
  gpuscope's exporter decodes it (``gpuscope.contract.gpu.CLOCK_EVENT_REASON_BITS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alerts import pod_join
from alerts.promql import indent
from gpuscope.contract import gpu as gpu_rows
from gpuscope.contract.gpu import CLOCK_EVENT_REASON_BITS
from gpuscope.contract.rows import MetricDef
from pack.contract import DRIVER_VERSION, GPU_NAME, PCI_BUS_ID, UUID, series
from pack.contract import XID as XID_LABEL
from pack.settings import GPU, Settings

SOURCE = "dcgm-exporter"
RELEASE = "4.5.3-4.8.2"
# What tells one GPU (or one MIG instance) from another: its scrape target, dcgm-exporter's
# index, the UUID, the MIG instance and the node. The rebuilt counters and the GPU's
# info are kept per these labels only, so a pod that comes or goes does not restart them.
KEYS = f"job, instance, {GPU}, GPU_I_ID, GPU_I_PROFILE, hostname"
# The whole GPU's: a property of the board, which dcgm-exporter repeats on each MIG
# instance and on each pod sharing the GPU. Recorded once per GPU, as the pack's rules
# multiply them one-to-one per GPU (the PCIe link's capacity).
GPU_KEYS = f"job, instance, {GPU}, hostname"
XID_LAST = "instance_gpu:DCGM_FI_DEV_XID_ERRORS:last"
# The labels dcgm-exporter names a GPU's holder pod with (the join by pod reads pod and
# namespace, alerts/pod_join.py). A scrape that gives its target labels of these names
# (the Prometheus Operator's pod, namespace and container of dcgm-exporter's own pod,
# unless dropped as the deploy's ServiceMonitor does; a plain Kubernetes SD config that
# maps them) renames dcgm-exporter's to exported_pod, exported_namespace and
# exported_container (honor_labels off): those are the holder's, and are taken back. (A
# GPU no pod holds then keeps the target's own pod, dcgm-exporter's: no engine's
# requests come from that pod, so the join by pod never meets it.)
HOLDER = ("pod", "namespace", "container")
# A MIG GPU instance's labels (its gpu and UUID are its parent's).
MIG = ("GPU_I_ID", "GPU_I_PROFILE")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Field:
    """One DCGM field recorded as a gpuscope GPU series."""

    dcgm: str
    row: MetricDef
    unit: str  # dcgm-exporter's unit, for the docs
    scale: str  # PromQL that takes the field to the row's base unit ("" for none)
    # the counters-file line that brings a field dcgm-exporter's default file leaves out
    # (None: in etc/default-counters.csv)
    counters_line: str | None = None
    whole_gpu: bool = False  # one series per GPU (GPU_KEYS), see there


PLAIN: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", gpu_rows.SM_CLOCK, "MHz", " * 1e6"),
    Field("DCGM_FI_DEV_MEM_CLOCK", gpu_rows.MEMORY_CLOCK, "MHz", " * 1e6"),
    Field(
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        gpu_rows.SM_CLOCK_MAX,
        "MHz",
        " * 1e6",
        "DCGM_FI_DEV_MAX_SM_CLOCK, gauge, Maximum SM clock frequency (in MHz).",
    ),
    Field(
        "DCGM_FI_DEV_MAX_MEM_CLOCK",
        gpu_rows.MEMORY_CLOCK_MAX,
        "MHz",
        " * 1e6",
        "DCGM_FI_DEV_MAX_MEM_CLOCK, gauge, Maximum memory clock frequency (in MHz).",
    ),
    Field("DCGM_FI_DEV_GPU_UTIL", gpu_rows.UTILIZATION, "%", " / 100"),
    Field(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        gpu_rows.SM_OCCUPANCY,
        "ratio",
        "",
        "DCGM_FI_PROF_SM_OCCUPANCY, gauge, The ratio of number of warps resident on an SM.",
    ),
    Field(
        "DCGM_FI_PROF_SM_ACTIVE",
        gpu_rows.SM_ACTIVE,
        "ratio",
        "",
        "DCGM_FI_PROF_SM_ACTIVE, gauge, The ratio of cycles an SM has at least 1 warp assigned.",
    ),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu_rows.TENSOR_ACTIVE, "ratio", ""),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", gpu_rows.DRAM_ACTIVE, "ratio", ""),
    Field(
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        gpu_rows.PCIE_LINK_GENERATION,
        "generation",
        "",
        "DCGM_FI_DEV_PCIE_LINK_GEN, gauge, PCIe link generation.",
        whole_gpu=True,
    ),
    Field(
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        gpu_rows.PCIE_LINK_WIDTH,
        "lanes",
        "",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH, gauge, PCIe link width (lanes).",
        whole_gpu=True,
    ),
    Field("DCGM_FI_DEV_FB_USED", gpu_rows.MEMORY_USED, "MiB", f" * {MIB}"),
    Field("DCGM_FI_DEV_FB_RESERVED", gpu_rows.MEMORY_RESERVED, "MiB", f" * {MIB}"),
    Field("DCGM_FI_DEV_POWER_USAGE", gpu_rows.POWER, "W", ""),
    Field(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        gpu_rows.POWER_LIMIT,
        "W",
        "",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT, gauge, Enforced power limit (in W).",
    ),
    Field("DCGM_FI_DEV_GPU_TEMP", gpu_rows.TEMPERATURE, "°C", ""),
    # a counter divided stays a counter: a reset (a reboot) is still a reset
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu_rows.ENERGY, "mJ", " / 1000"),
)
# The framebuffer in total: used + free + reserved (DCGM splits it so, as NVML's
# memory v2 does), all three in the default counters.
FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
ECC: tuple[tuple[str, str, str], ...] = (
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "volatile_corrected",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "volatile_uncorrected",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.",
    ),
)
CLOCK_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
CLOCK_EVENTS_LINE = f"{CLOCK_EVENTS}, gauge, Current clock event reasons (bitmask)."
PCIE: tuple[tuple[str, MetricDef], ...] = (
    ("DCGM_FI_PROF_PCIE_TX_BYTES", gpu_rows.PCIE_TRANSMIT),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", gpu_rows.PCIE_RECEIVE),
)
XID = "DCGM_FI_DEV_XID_ERRORS"


def counters_lines() -> list[str]:
    """The lines a dcgm-exporter counters file needs beyond the default one, for the docs
    and the fixture's counters file."""
    lines = [f.counters_line for f in PLAIN if f.counters_line]
    return [*lines, *(line for _, _, line in ECC), CLOCK_EVENTS_LINE]


def normalized(settings: Settings, name: str, extra: str = "") -> str:
    """dcgm-exporter's series ``name`` with gpuscope's label names: ``uuid`` from ``UUID``
    and ``hostname`` from ``Hostname`` where the release writes those (their regex
    matches only a value, so a series that already has ``uuid`` or ``hostname`` keeps
    it); the holder's ``pod``, ``namespace`` and ``container`` from ``exported_*`` where
    the scrape renamed them (``HOLDER``); the metric name goes, as any aggregation
    drops it."""
    selector = name + settings.dcgm_sel(extra)
    uuid = f'label_replace({selector}, "{UUID}", "$1", "UUID", "(.+)")'
    labelled = f'label_replace({uuid}, "hostname", "$1", "Hostname", "(.+)")'
    for holder in HOLDER:
        renamed = f'"{holder}", "$1", "exported_{holder}", "(.+)"'
        labelled = f"label_replace(\n  {indent(labelled)},\n  {renamed}\n)"
    exported = ", ".join(f"exported_{holder}" for holder in HOLDER)
    return f"max without (UUID, Hostname, {exported}) (\n  {indent(labelled)}\n)"


def _rule(record: str, expr: str, **labels: str) -> dict[str, Any]:
    return {"record": record, "expr": expr, "labels": {"source": SOURCE, **labels}}


def _own(settings: Settings, record: str) -> str:
    """The rule's own series of the previous evaluation: of dcgm-exporter's job, which
    gpuscope's exporter, serving the same names, is not."""
    return record + settings.dcgm_sel()


def _keyed(settings: Settings, name: str) -> str:
    return f"max by ({KEYS}) (\n  {indent(normalized(settings, name))}\n)"


def _plain(settings: Settings, field: Field) -> str:
    expr = normalized(settings, field.dcgm)
    if field.whole_gpu:
        expr = f"max by ({GPU_KEYS}) (\n  {indent(expr)}\n)"
    return expr + field.scale


def pcie_rule(settings: Settings, dcgm: str, row: MetricDef) -> dict[str, Any]:
    record, rate = series(row), _keyed(settings, dcgm)
    own = _own(settings, record)
    # time() - timestamp(own): the seconds since the previous evaluation wrote it
    expr = (
        f"(\n  {own}\n  + on ({KEYS})\n  {indent(rate)}\n"
        f"  * on ({KEYS}) (time() - timestamp({own}))\n)\n"
        f"or on ({KEYS})\n0 * {rate}"
    )
    return _rule(record, expr)


def xid_rules(settings: Settings) -> list[dict[str, Any]]:
    """The two XID counters, then the code they compare with (recorded after them, so
    they read the one of the previous evaluation)."""
    last = _keyed(settings, XID)
    by_code = (
        f"max without (err_code) (\n  label_replace(\n    max by ({KEYS}, err_code) (\n      "
        f"{indent(indent(indent(normalized(settings, XID))))}\n    ),\n"
        f'    "{XID_LABEL}", "$1", "err_code", "(.*)"\n  )\n)'
    )
    new_xid = f"(\n  {indent(last)}\n  > bool 0\n)"
    changed = f"(\n  {indent(last)}\n  != bool on ({KEYS}) {XID_LAST}\n)\n* on ({KEYS}) {new_xid}"
    changed_code = (
        f"(\n  {indent(by_code)}\n  != bool on ({KEYS}) group_left {XID_LAST}\n)\n"
        f"* on ({KEYS}) group_left () {new_xid}"
    )
    events, errors = series(gpu_rows.XID_EVENTS), series(gpu_rows.XID_ERRORS)
    own_events, own_errors = _own(settings, events), _own(settings, errors)
    return [
        _rule(
            events,
            f"(\n  {own_events}\n  + on ({KEYS})\n  {indent(changed)}\n)\n"
            f"or on ({KEYS})\n0 * {last}",
        ),
        _rule(
            errors,
            # the current code's count goes up; the other codes' counts carry on while
            # the GPU is there; a code seen for the first time starts
            f"(\n  {own_errors}\n  + on ({KEYS}, {XID_LABEL})\n  {indent(changed_code)}\n)\n"
            f"or on ({KEYS}, {XID_LABEL})\n({own_errors} and on ({KEYS}) {last})\n"
            f"or on ({KEYS}, {XID_LABEL})\n{changed_code}",
        ),
        {"record": XID_LAST, "expr": last},
    ]


def dcgm_groups(settings: Settings) -> list[dict[str, Any]]:
    rules = [_rule(series(f.row), _plain(settings, f)) for f in PLAIN]
    total = "\n+\n".join(normalized(settings, name) for name in FB_PARTS)
    rules.append(_rule(series(gpu_rows.MEMORY_TOTAL), f"(\n{total}\n)\n* {MIB}"))
    rules += [
        _rule(series(gpu_rows.ECC_ERRORS), normalized(settings, d), type=t) for d, t, _ in ECC
    ]
    mask = normalized(settings, CLOCK_EVENTS)
    rules += [
        _rule(
            series(gpu_rows.CLOCK_EVENT_ACTIVE),
            f"floor(\n  {indent(mask)}\n  / {bit}\n) % 2",
            reason=reason,
        )
        for reason, bit in CLOCK_EVENT_REASON_BITS
    ]
    rules += [pcie_rule(settings, dcgm, row) for dcgm, row in PCIE]
    # Each GPU dcgm-exporter serves the framebuffer of (a default field that a MIG
    # instance has too) is up, with its descriptive labels on gpuscope_gpu_info.
    fb = normalized(settings, "DCGM_FI_DEV_FB_USED")
    info = (
        f"label_replace(\n  label_replace(\n    {indent(indent(fb))},\n"
        f'    "{GPU_NAME}", "$1", "modelName", "(.*)"\n  ),\n'
        f'  "{DRIVER_VERSION}", "$1", "DCGM_FI_DRIVER_VERSION", "(.*)"\n)'
    )
    rules += [
        _rule(series(gpu_rows.UP), f"group by ({KEYS}) (\n  {indent(fb)}\n)"),
        _rule(
            series(gpu_rows.INFO),
            f"group by ({KEYS}, {GPU_NAME}, {PCI_BUS_ID}, {DRIVER_VERSION}) (\n  {indent(info)}\n)",
        ),
    ]
    rules += xid_rules(settings)
    # the pods holding each GPU, for the join by pod (after the fields they read)
    rules += pod_join.map_rules(settings)
    return [{"name": "gpuscope-dcgm-exporter", "interval": settings.interval, "rules": rules}]


def releases_comment() -> str:
    return (
        f"# dcgm-exporter {RELEASE}'s DCGM_FI_* series as gpuscope's gpuscope_gpu_* "
        "(alerts/dcgm_rules.py).\n"
    )
