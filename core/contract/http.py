"""The HTTP paths gpuscope's servers answer on, and the exporter's default port.

The exporter serves all four paths; the worker ``/metrics``, ``/healthz`` and
``/readyz`` (with its OpenAI routes). The middleware sends its spans to
``DEFAULT_TRACES_URL`` when nothing else is configured, so it imports this module on
its import path: it must stay standard library only.
"""

from __future__ import annotations

from typing import Final

# Where the exporter listens unless told otherwise: every interface, as Prometheus
# exporters do.
DEFAULT_PORT: Final = 9420
DEFAULT_LISTEN: Final = f":{DEFAULT_PORT}"
LOOPBACK_LISTEN: Final = f"127.0.0.1:{DEFAULT_PORT}"
DEFAULT_URL: Final = f"http://{LOOPBACK_LISTEN}"

METRICS_PATH: Final = "/metrics"
# Liveness: answers while the process serves at all.
HEALTHZ_PATH: Final = "/healthz"
# Readiness: 200 once the server serves (and, for the exporter, its GPU poll is fresh).
READYZ_PATH: Final = "/readyz"
PROBE_PATHS: Final = (HEALTHZ_PATH, READYZ_PATH)
# OTLP/HTTP's traces path, which the exporter serves.
TRACES_PATH: Final = "/v1/traces"
DEFAULT_TRACES_URL: Final = DEFAULT_URL + TRACES_PATH

# The example credentials the Kubernetes ``secure`` component ships (its web config's
# basic-auth user and the bcrypt hash, cost 10, of the password of its scrape
# credentials; the senders' bearer token): placeholders anyone can read, which the
# exporter refuses to start or reload with (``gpuscope.exporter.http.placeholders``).
EXAMPLE_USER: Final = "prometheus"
EXAMPLE_PASSWORD: Final = "change-me"
EXAMPLE_HASH: Final = "$2b$10$3jxnQfxCz2kT4DrQtCYJi.D7sXsqkjYIpRspY0HlX3DU1Vx0IMrAy"
EXAMPLE_TOKEN: Final = "replace-with-a-long-random-token"
