"""Alerts on how a GPU is shared, placed and clocked: several processes time-slicing it,
a process on it that runs on the other NUMA node, an SM clock that swings under
compute-bound requests. All are ``info``: they explain slow requests rather than break
them, and each has a fix the runbook gives. A group of their own: they need processes
on a real GPU (NVML's listing) or the poller's clock-change count, which the simulated
GPUs that fire the GPU group's alerts (``alerts/tests/simulated_gpus_test.yml``) do not
give.

Contention and a swinging clock matter only where the requests on that GPU are
compute-bound (the verdict's ``compute`` cause: the compute phase over
``dominant_share`` of the mean request time): a co-tenant that waits on a GPU serving
queued or batching requests, or a clock that drops while the GPU idles, slows nothing.
The requests are joined on the GPU's host, index and UUID, as the verdict joins them;
a MIG instance's requests carry its ``MIG-…`` UUID, and its clock is its parent's
(``gpuscope_gpu_mig_info``'s ``parent_uuid``)."""

from __future__ import annotations

from typing import Any

from alerts.alert_rule import alert
from alerts.gpu_rules import INSTANCE_GPU
from alerts.promql import INSTANCE, indent, with_host
from alerts.recording import PHASE_SHARE_MEAN, phase_is
from gpuscope.contract import gpu as gpu_rows
from pack.contract import LOCALITY, PARENT_UUID, UUID, series
from pack.recorded import COMPUTE
from pack.settings import HOST_GPU, Settings

ON_GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }})"


def compute_bound(settings: Settings) -> str:
    """1 per host, GPU index and UUID whose requests (any source, service or model) are
    compute-bound: the verdict's ``compute`` condition."""
    share = f"{PHASE_SHARE_MEAN}{settings.window}{phase_is(COMPUTE)}"
    return f"max by ({HOST_GPU}) ({share} > {settings.dominant_share:g})"


def on_compute_bound(settings: Settings, per_gpu: str) -> str:
    """``per_gpu`` (labels job, instance, gpu, uuid), with a ``host`` label, where the
    requests on that GPU are compute-bound."""
    return f"{with_host(settings, per_gpu)}\nand on ({HOST_GPU})\n{compute_bound(settings)}"


def clock_swings(settings: Settings) -> str:
    """Per GPU (and per MIG instance, from its parent), the SM clock's changes over the
    window, where at least ``clock_swing_changes``: the poller counts a poll whose SM
    clock differs from the previous one, which a locked clock never does."""
    w = settings.window
    changes = (
        f"increase({series(gpu_rows.SM_CLOCK_CHANGES)}{settings.sel()}[{w}]) "
        f">= {settings.clock_swing_changes:g}"
    )
    parent = f'label_replace(\n  {changes},\n  "{PARENT_UUID}", "$1", "{UUID}", "(.+)"\n)'
    mig = (
        f"max by ({INSTANCE_GPU}) (\n"
        f"  {series(gpu_rows.MIG_INFO)}{settings.sel()}\n"
        f"  * on ({INSTANCE}, {PARENT_UUID}) group_left ()\n"
        f"  {indent(parent)}\n)"
    )
    return f"{changes}\nor\n{mig}"


def sharing_alerts(settings: Settings) -> list[dict[str, Any]]:
    w = settings.window
    contended = series(gpu_rows.CONTENDED) + settings.sel()
    remote = series(gpu_rows.PROCESS_NUMA_LOCALITY) + settings.sel(f'{LOCALITY}="remote"')
    processes = (
        f'{{{{ with printf "{series(gpu_rows.COMPUTE_PROCESSES)}{{instance=%q, {UUID}=%q}}" '
        f"$labels.instance $labels.{UUID} | query }}}}"
        "{{ . | first | value }}{{ else }}more "
        "than one{{ end }}"
    )
    target = (
        f'{{{{ with printf "{series(gpu_rows.SM_CLOCK_TARGET)}{{instance=%q, {UUID}=%q}}" '
        f"$labels.instance $labels.{UUID} | query }}}}"
        "the applications clock target ({{ . | first | value | humanize }}Hz) does not "
        "hold it{{ else }}NVML reports no applications clock target for it{{ end }}"
    )
    return [
        alert(
            settings,
            "GpuscopeGpuContended",
            # held for the whole window: a process that starts and exits is no co-tenant
            on_compute_bound(settings, f"min_over_time({contended}[{w}]) == 1"),
            settings.for_(settings.for_gpu_contended),
            "info",
            "Several processes time-slice one GPU without MPS or MIG while its requests "
            "are compute-bound.",
            f"{ON_GPU} on {{{{ $labels.instance }}}} has had more than one compute process "
            f"for {w} ({processes} now), none through MPS, in the default compute mode, "
            "while the requests there are compute-bound: their kernels run in turns; "
            f"{series(gpu_rows.PROCESS_SM_UTILIZATION)} shows who takes the SMs.",
        ),
        alert(
            settings,
            "GpuscopeProcessNumaRemote",
            f"{remote} == 1",
            settings.for_(settings.for_numa_remote),
            "info",
            "A process on a GPU runs on the far NUMA node.",
            f"Process {{{{ $labels.pid }}}} on {ON_GPU} on {{{{ $labels.instance }}}} may "
            "run on none of the GPU's CPUs or allocate on none of its memory nodes: every "
            "host-device copy crosses the socket interconnect; gpuscope doctor prints the "
            "numactl line that binds it.",
        ),
        alert(
            settings,
            "GpuscopeGpuClockUnlocked",
            on_compute_bound(settings, clock_swings(settings)),
            settings.for_(settings.for_clock_unlocked),
            "info",
            "A GPU's SM clock swings while its requests are compute-bound.",
            f"The SM clock of {ON_GPU} on {{{{ $labels.instance }}}} changed "
            f"{{{{ $value | humanize }}}} times in {w} while the requests there are "
            f"compute-bound, so their compute time moves with it; {target}. "
            "nvidia-smi -lgc locks it (see the runbook for the trade-off).",
        ),
    ]
