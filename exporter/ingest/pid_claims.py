"""The process a span's resource names, read for the GPU process join.

``process.pid`` (an int: OpenTelemetry's process resource, gpuscope's
``setup_tracing()``), else vLLM's ``vllm.process_id`` (a string of digits); with the
namespace that pid belongs to when the sender runs in a container of its own:
``container.id`` (OpenTelemetry's container resource detector) or ``k8s.pod.uid``
(the downward API's ``metadata.uid``, sent through ``OTEL_RESOURCE_ATTRIBUTES``). An
attribute of the wrong type or form is left out, never an error: the span still
counts, only without the join.
"""

from __future__ import annotations

from typing import Any, Final

from gpuscope.exporter.gpu.pid_namespaces import PidClaim, normal_container_id

PROCESS_PID: Final = "process.pid"
VLLM_PROCESS_ID: Final = "vllm.process_id"
CONTAINER_ID: Final = "container.id"
K8S_POD_UID: Final = "k8s.pod.uid"
_MAX_ID_LENGTH: Final = 128  # a container id is 64 hex digits, a pod uid 36 characters
_STRING, _INT = "string_value", "int_value"


def read_pid_claim(attributes: Any, *, authenticated: bool) -> PidClaim | None:
    """The claim of one resource's attributes, or None when it names no pid."""
    pid: int | None = None
    vllm_pid: int | None = None
    container_id = pod_uid = ""
    for kv in attributes:
        key = kv.key
        if key not in _WANTED:
            continue
        value = kv.value
        which = value.WhichOneof("value")
        if key == PROCESS_PID and which == _INT:
            pid = value.int_value if value.int_value > 0 else None
        elif which != _STRING:
            continue
        elif key == VLLM_PROCESS_ID:
            text = value.string_value
            if 0 < len(text) <= 10 and text.isascii() and text.isdigit():
                vllm_pid = int(text) or None
        elif len(value.string_value) <= _MAX_ID_LENGTH:
            if key == CONTAINER_ID:
                container_id = normal_container_id(value.string_value)
            else:
                pod_uid = value.string_value.strip().lower()
    pid = pid or vllm_pid
    if pid is None:
        return None
    return PidClaim(pid, container_id, pod_uid, authenticated)


_WANTED: Final = frozenset((PROCESS_PID, VLLM_PROCESS_ID, CONTAINER_ID, K8S_POD_UID))
