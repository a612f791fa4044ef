"""Alerts on how a GPU is shared and placed: several processes time-slicing it, and a
process on it that runs on the other NUMA node. Both are ``info``: they explain slow
requests rather than break them, and each has a fix the runbook gives. A group of their
own: they need processes on a real GPU (NVML's listing), which the simulated GPUs that
fire the GPU group's alerts (``alerts/tests/simulated_gpus_test.yml``) do not place."""

from __future__ import annotations

from typing import Any

from alerts.alert_rule import alert
from gpuscope.contract import gpu as gpu_rows
from pack.contract import series
from pack.settings import Settings

ON_GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }})"


def sharing_alerts(settings: Settings) -> list[dict[str, Any]]:
    w = settings.window
    contended = series(gpu_rows.CONTENDED) + settings.sel()
    remote = series(gpu_rows.PROCESS_NUMA_LOCALITY) + settings.sel('locality="remote"')
    return [
        alert(
            settings,
            "GpuscopeGpuContended",
            # held for the whole window: a process that starts and exits is no co-tenant
            f"min_over_time({contended}[{w}]) == 1",
            settings.for_(settings.for_gpu_contended),
            "info",
            "Several processes time-slice one GPU without MPS or MIG.",
            f"{ON_GPU} on {{{{ $labels.instance }}}} has had more than one compute process "
            f"for {w}, none through MPS, in the default compute mode: their kernels run in "
            f"turns; {series(gpu_rows.PROCESS_SM_UTILIZATION)} shows who takes the SMs.",
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
    ]
