"""The label names of gpuscope's metric families, written once.

The rows (``exporter``, ``gpu``, ``worker``) are declared with these; the aggregator
builds its label tuples by them (``rows.label_order``); the pack's builders select
and group by them (``pack/contract.py``, which checks each against the rows that must
carry it).
"""

from __future__ import annotations

from typing import Final

# Requests: who sent them, for what, and the GPU they ran on.
SERVICE: Final = "service"
MODEL: Final = "model"
# The GenAI conventions key request metrics on gen_ai.operation.name too.
OPERATION: Final = "operation"
ROUTE: Final = "route"
CODE: Final = "code"
# The NVML index and the UUID of a GPU: the UUID is the join of requests and GPUs.
GPU: Final = "gpu"
UUID: Final = "uuid"
# The Kubernetes pod a request's spans came from (their resource's ``k8s.pod.name`` /
# ``k8s.namespace.name``), on request series that name no GPU: the rules join them to
# the GPU the pod holds (``alerts/pod_join.py``). Written only when set (``OMIT_EMPTY``).
NAMESPACE: Final = "namespace"
POD: Final = "pod"
# Labels a series leaves out where their value is empty (Prometheus reads an empty
# label and an absent one alike), so a sender without them serves what it did before.
OMIT_EMPTY: Final = frozenset({NAMESPACE, POD})
PHASE: Final = "phase"
STAGE: Final = "stage"
DIRECTION: Final = "direction"
# The values of ``direction``.
INPUT: Final = "input"
OUTPUT: Final = "output"

# The spanmetrics connector's labels, plus the response status (see ``stock_spans``).
SERVICE_NAME: Final = "service_name"
SPAN_NAME: Final = "span_name"
SPAN_KIND: Final = "span_kind"
STATUS_CODE: Final = "status_code"
HTTP_STATUS_CODE: Final = "http_status_code"
RPC_GRPC_STATUS_CODE: Final = "rpc_grpc_status_code"

# The exporter's and the worker's own metrics.
REASON: Final = "reason"
RESULT: Final = "result"
STATE: Final = "state"
METRIC: Final = "metric"
VERSION: Final = "version"
REQUESTED: Final = "requested"
SOURCE: Final = "source"

# The GPU side.
NAME: Final = "name"
PCI_BUS_ID: Final = "pci_bus_id"
NUMA_NODE: Final = "numa_node"
DRIVER_VERSION: Final = "driver_version"
PARENT_GPU: Final = "parent_gpu"
PARENT_UUID: Final = "parent_uuid"
PROFILE: Final = "profile"
GPU_INSTANCE_ID: Final = "gpu_instance_id"
COMPUTE_INSTANCE_ID: Final = "compute_instance_id"
XID: Final = "xid"
ECC_TYPE: Final = "type"
STATUS: Final = "status"
MODE: Final = "mode"
PID: Final = "pid"
LOCALITY: Final = "locality"
COLLECTOR: Final = "collector"

# The reference worker.
ENDPOINT: Final = "endpoint"
OUTCOME: Final = "outcome"
BATCHING: Final = "batching"
KIND: Final = "kind"
