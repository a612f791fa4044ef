"""The join by pod: requests that name no GPU, joined to the GPU their pod holds.

vLLM's ``/metrics`` never names a GPU (its recorded request series have ``uuid=""``),
so without this join their verdict meets the GPU conditions of their whole ``host``
(``recording.host_conditions``), where a host is underfed only when every one of its
GPUs is: a pod on an underfed GPU next to a busy one never read ``underfed``, and two
pods of one model on one node were one series.

In Kubernetes both sides know the pod. dcgm-exporter labels each GPU's series with
the ``pod`` / ``namespace`` of the pod the kubelet gave the GPU to (its holder; the
rules of ``dcgm_rules.py`` keep them, from ``exported_pod`` / ``exported_namespace``
where the scrape renamed them); the engine's scrape target carries its own ``pod`` /
``namespace`` (the Kubernetes service discovery relabelling of the deploy's PodMonitor).
So the engine's request series are joined on ``(namespace, pod)`` to the one GPU their
pod holds and take that GPU's ``host``, ``gpu`` and ``uuid``: the verdict then meets
that GPU's conditions through the UUID join, and names it.

- Only a pod that holds exactly one GPU is joined (``POD_ONE_GPU``): the requests of a
  pod holding several (tensor parallelism) run on all of them, and a series cannot
  carry several UUIDs; they keep ``uuid=""`` and their host's conditions.
- A MIG instance is kept per instance: dcgm-exporter labels it with its parent's
  ``gpu`` and ``UUID`` and its own ``GPU_I_ID``, and the per-GPU conditions average a
  GPU's instances. A pod holding one instance takes ``gpu="<gpu>/<GPU_I_ID>"`` and the
  parent's UUID, and meets that instance's conditions (``mig_conditions``: its own SM
  occupancy; its GPU's clocks and PCIe link).
- gpuscope's exporter, without a process join (``--gpu-source none`` beside
  dcgm-exporter), labels its request series that name no GPU with the pod of their
  spans' resource (``k8s.namespace.name`` / ``k8s.pod.name``); ``spans_by_pod`` joins
  those the same way, from ``exported_pod`` / ``exported_namespace`` where the scrape
  renamed them (a target labelled with the exporter's own pod).
- Requests whose target has no pod, or whose pod holds no GPU dcgm-exporter names (a
  plain Prometheus, gpuscope's own NVML source, which writes no pod), are left as they
  are: the UUID join where they name a GPU, their host's conditions where not.
"""

from __future__ import annotations

from typing import Any

from gpuscope.contract import gpu as gpu_rows
from pack.contract import GPU_INDEX, series
from pack.settings import GPU, Settings

POD = "namespace, pod"
# The labels the join reads beyond gpuscope's rows: the pod's (Kubernetes service
# discovery's on an engine's target, dcgm-exporter's holder on a GPU's series) and
# dcgm-exporter's MIG instance.
LABELS = ("namespace", "pod", "GPU_I_ID")
# 1 per (namespace, pod) and the GPU it holds, with the GPU's host (its exporter's
# instance without the port, as ``recording.with_host`` writes it)
POD_GPU = "pod_host_gpu:gpuscope_gpu_info:max"
# the same for the pods that hold exactly one GPU: the join's right-hand side, one series
# per (namespace, pod)
POD_ONE_GPU = "pod_host_gpu:gpuscope_gpu_info:one"
# what the join copies onto the request series
JOINED = f"host, {GPU}"
# A MIG instance of dcgm-exporter's (its gpu and UUID its parent's, GPU_I_ID its own) as
# the request series and the verdict name it: gpu "<gpu>/<GPU_I_ID>" ("0/1"), the UUID
# the parent's. (gpuscope's NVML source names an instance "0:1", the MIG device index,
# with a MIG-… UUID of its own.)
MIG_SEPARATOR = "/"
INSTANCE_GPU = f"job, instance, {GPU}"
MIG_INSTANCE = f"{INSTANCE_GPU}, GPU_I_ID"


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def mig_gpu(expr: str) -> str:
    """``expr`` (MIG instances' series) with ``gpu`` as ``<gpu>/<GPU_I_ID>``: the instance
    as the request series and the verdict name it."""
    joined = f'"{GPU_INDEX}", "{MIG_SEPARATOR}", "{GPU_INDEX}", "GPU_I_ID"'
    return f"label_join(\n  {_indent(expr)},\n  {joined}\n)"


def mig_conditions(settings: Settings, conditions: dict[str, str]) -> dict[str, str]:
    """The GPU ``conditions`` (per job, instance, gpu and uuid) per MIG instance of
    dcgm-exporter's (``gpu`` as ``mig_gpu`` writes it): ``underfed`` by the instance's
    own SM occupancy; ``throttled`` and ``pcie`` by its GPU's (clocks and the PCIe link
    are the whole GPU's)."""
    w, mig = settings.window, settings.dcgm_sel('GPU_I_ID!=""')
    occupancy = (
        f"avg by ({MIG_INSTANCE}) (\n  avg_over_time({series(gpu_rows.SM_OCCUPANCY)}{mig}[{w}])\n)"
        f"\n< {settings.underfed_occupancy:g}"
    )
    instances = f"group by ({MIG_INSTANCE}) ({series(gpu_rows.MEMORY_USED)}{mig})"
    per_gpu = f"{instances}\n* on ({INSTANCE_GPU}) group_left ()"
    whole = {
        cause: f"{per_gpu}\n(\n  {_indent(conditions[cause])}\n)" for cause in ("throttled", "pcie")
    }
    return {"underfed": mig_gpu(occupancy), **{c: mig_gpu(e) for c, e in whole.items()}}


def map_rules(settings: Settings) -> list[dict[str, Any]]:
    """The GPUs each pod holds, recorded at the end of dcgm-exporter's group (``dcgm_rules``)
    from the GPU series recorded from dcgm-exporter's (the
    framebuffer used: a default field, one series per GPU and holder). Only
    dcgm-exporter's: a ``pod`` on gpuscope's own GPU series is its exporter's, which a
    scrape's target labels put on every GPU of the node."""
    used = series(gpu_rows.MEMORY_USED)
    whole = used + settings.dcgm_sel('pod!="", GPU_I_ID=""')
    instances = mig_gpu(used + settings.dcgm_sel('pod!="", GPU_I_ID!=""'))
    held = f"{whole}\nor\n{instances}"
    host = (
        f"label_replace(\n  (\n    {_indent(_indent(held))}\n  ),\n"
        f'  "host", "$1", "instance", "{settings.host_from_instance}"\n)'
    )
    return [
        {"record": POD_GPU, "expr": f"max by ({POD}, {JOINED}) (\n  {_indent(host)} * 0 + 1\n)"},
        {
            "record": POD_ONE_GPU,
            "expr": f"{POD_GPU}\nand on ({POD})\n(count by ({POD}) ({POD_GPU}) == 1)",
        },
    ]


def own_pod(expr: str) -> str:
    """``expr`` (the exporter's request series) with the ``pod`` / ``namespace`` the
    exporter wrote (its senders', from their spans' resource) where the scrape renamed
    them ``exported_*`` (a target labelled with its own pod, as the Prometheus Operator's
    monitors label the exporter's)."""
    for label in ("pod", "namespace"):
        expr = (
            f'label_replace(\n  {_indent(expr)},\n  "{label}", "$1", "exported_{label}", "(.+)"\n)'
        )
    return expr


def spans_by_pod(unnamed: str, named: str) -> str:
    """The exporter's request series: ``unnamed`` (those with ``uuid=""``, its process
    join found no GPU: ``--gpu-source none``, or a process on several GPUs) joined by the
    pod their spans came from (``k8s.pod.name`` / ``k8s.namespace.name``, which the
    exporter writes on these series only) to the one GPU that pod holds (``by_pod``), and
    ``named`` (those naming their GPU) as they are."""
    return f"{by_pod(own_pod(unnamed))}\nor\n{named}"


def by_pod(expr: str) -> str:
    """``expr`` (request series with ``host``, and ``namespace`` / ``pod`` where the target
    has them) with the ``host``, ``gpu`` and ``uuid`` of the one GPU its pod holds, and as
    it is where its pod holds none or several: aggregate it ``by`` those labels."""
    return (
        f"(\n  {_indent(expr)}\n  * on ({POD}) group_left ({JOINED})\n  {POD_ONE_GPU}\n)\n"
        f"or on ({POD})\n{expr}"
    )
