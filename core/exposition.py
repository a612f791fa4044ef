"""How a ``/metrics`` answer is negotiated, for the exporter and the worker alike.

The format comes from ``Accept`` through prometheus_client's ``choose_encoder``, which
raises on a malformed ``version=`` (``application/openmetrics-text; version=abc``): any
client got a 500 and left a logged traceback. Here a header it cannot read gets the
Prometheus text format, as one without a known media type does. Media types are
compared without regard to case (RFC 9110), which prometheus_client does not do.
Compression comes from ``Accept-Encoding`` with its q-values, which prometheus_client's
``gzip_accepted`` ignores (``gzip;q=0`` got gzip). Both vary by request header, which
``VARY`` tells a cache in between.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

VARY = "Accept, Accept-Encoding"

Encoder = Callable[[Collector], bytes]


def choose_format(accept: str) -> tuple[Encoder, str]:
    """The encoder and content type ``accept`` asks for; the text format if it cannot
    be read."""
    try:
        return choose_encoder(accept.lower())
    except Exception:  # a version that is no version: TypeError or ValueError
        return choose_encoder("")


def gzip_wanted(accept_encoding: str) -> bool:
    """Whether ``accept_encoding`` accepts gzip with a q-value above 0."""
    for item in accept_encoding.split(","):
        coding, *parameters = item.split(";")
        if coding.strip().lower() != "gzip":
            continue
        quality = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value.strip())
                except ValueError:
                    quality = 0.0  # unreadable: a plain answer is always acceptable
        if quality > 0:
            return True
    return False
