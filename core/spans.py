"""Span names and attribute keys: the contract between middleware and exporter.

Both import these constants (phases and their marks, batch triggers too) from here, a
module without dependencies, so a rename here is a rename everywhere. See
docs/spans.md for the meaning of each one (a test keeps the two in step).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

INSTRUMENTATION_NAME: Final = "gpuscope"

# The longest duration a span may report in an attribute (a phase, time to first token,
# time per output token, an engine's own phases). Any finite float used to be accepted,
# so two spans with a TTFT of 1.7e308 made a histogram's ``_sum`` +Inf until restart,
# and ``rate(_sum)`` useless for every sender sharing those labels. No request served
# over HTTP lasts a day (clients, proxies and load balancers give up hours before), and
# with every observation at most a day, ``_sum`` stays finite and exact to well under a
# millisecond for 10^9 observations.
MAX_DURATION_S: Final = 86_400.0
# The largest count one span may report: tokens in one direction, a batch's size. Any
# int64 used to be accepted, and one span of 2^63-1 tokens left a float counter where
# every later increment rounds away (+5,000 became +0). The longest context windows
# served are 10^7 tokens; with every count at most that, a token counter stays exact
# (float64 holds every integer to 2^53) for 9 * 10^8 spans of the largest size.
MAX_COUNT: Final = 10_000_000
# What a span's durations may disagree by and still count: the phases together, a
# compute's stages together, time to first token, each at most what holds them (the
# span, the compute phase). Engines measure these from separate clock readings, so
# they may round past each other; a request's clock does not run a millisecond fast.
DURATION_SLACK_S: Final = 0.001

# HTTP semantic conventions (stable names).
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_ROUTE: Final = "http.route"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
URL_PATH: Final = "url.path"
URL_SCHEME: Final = "url.scheme"
URL_QUERY: Final = "url.query"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
CLIENT_ADDRESS: Final = "client.address"
USER_AGENT_ORIGINAL: Final = "user_agent.original"
NETWORK_PROTOCOL_VERSION: Final = "network.protocol.version"
ERROR_TYPE: Final = "error.type"

# GenAI semantic conventions.
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"

# Phases, in the order they happen: phase -> (start mark, end mark), the only place that
# pairs them. Each starts where the one before ended (a test checks it), so the phases of
# a fully marked request add up to its duration. ``first_token`` bounds no phase (under
# continuous batching it falls inside ``compute``).
PHASE_MARKS: Final[dict[str, tuple[str, str]]] = {
    "preprocess": ("arrived", "enqueued"),
    "queue": ("enqueued", "admitted"),
    "batch_wait": ("admitted", "dispatched"),
    "compute": ("dispatched", "computed"),
    "postprocess": ("computed", "finished"),
}
PHASES: Final = tuple(PHASE_MARKS)
# The marks that bound the phases, in the order they are set.
MARKS: Final = (*(start for start, _ in PHASE_MARKS.values()), PHASE_MARKS[PHASES[-1]][1])
# ``gpuscope.<phase>.duration`` is in seconds.
PHASE_DURATION: Final = {phase: f"gpuscope.{phase}.duration" for phase in PHASES}
# Phases that also become child spans of the server span.
PHASE_SPANS: Final = {
    "queue": "gpuscope.queue",
    "batch_wait": "gpuscope.batch_wait",
    "compute": "gpuscope.compute",
}

# The exporter's answer to an export request says what becomes of the phase child spans
# (``PHASE_SPANS``): dropped (read from the server span's attributes), or forwarded to a
# trace backend (``--forward-otlp``) as well. The middleware's own span exporter reads
# it, so that phase spans turn themselves on where a trace view shows them.
PHASE_SPANS_HEADER: Final = "Gpuscope-Phase-Spans"
PHASE_SPANS_DROPPED: Final = "dropped"
PHASE_SPANS_FORWARDED: Final = "forwarded"

# Parts of ``compute`` that a continuous-batching engine reports (vLLM: prefill, then
# decode); they add up to ``compute`` and are never summed with the phases.
COMPUTE_STAGES: Final = ("prefill", "decode")
COMPUTE_STAGE_DURATION: Final = {
    stage: f"gpuscope.compute.{stage}.duration" for stage in COMPUTE_STAGES
}

BATCH_ID: Final = "gpuscope.batch.id"
BATCH_SIZE: Final = "gpuscope.batch.size"
BATCH_MAX_SIZE: Final = "gpuscope.batch.max_size"
BATCH_TRIGGER: Final = "gpuscope.batch.trigger"
BATCH_SPAN_NAME: Final = "gpuscope.batch"

GPU_UUID: Final = "gpuscope.gpu.uuid"
TIME_TO_FIRST_TOKEN: Final = "gpuscope.time_to_first_token"
TIME_PER_OUTPUT_TOKEN: Final = "gpuscope.time_per_output_token"
# Overrides the resource's service.name for this span (several apps in one process).
SERVICE_NAME: Final = "gpuscope.service.name"
# Number of marks the application set out of order (ignored); absent when zero.
MARKS_IGNORED: Final = "gpuscope.marks.ignored"

# error.type when the client went away before the last body chunk was sent.
CLIENT_DISCONNECTED: Final = "client_disconnected"
CLIENT_CLOSED_REQUEST_STATUS: Final = 499
# error.type when the app returned without starting a response (the server sends 500).
NO_RESPONSE: Final = "no_response"


class BatchTrigger(StrEnum):
    """Why a batch was dispatched: the value of ``gpuscope.batch.trigger``."""

    FULL = "full"  # it reached its maximum size
    TIMEOUT = "timeout"  # its forming window ended (or nothing more was queued)
    ITERATION = "iteration"  # one iteration of continuous batching
