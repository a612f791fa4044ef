"""gpuscope exporter health: is it scraped, are spans arriving and accepted, is it capped?"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.models.common import BigValueTextMode

from dashboards.panels import (
    EXPORTER_CHAIN,
    HALF,
    QUARTER,
    RATE,
    THIRD,
    new_dashboard,
    query,
    row,
    selector,
    stat_panel,
    timeseries,
)
from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract.rows import MetricDef
from pack.contract import CONNECTION_STATE, OVERFLOWED_METRIC, REASON, VERSION, series

UID = "gpuscope-exporter-health"
EXPORTER = selector("job", "instance")


def per_second(counter: MetricDef, by: str) -> str:
    return f"sum by ({by}) (rate({series(counter)}{EXPORTER}[{RATE}]))"


def build() -> Dashboard:
    board = new_dashboard(
        UID,
        "gpuscope / Exporter health",
        "The exporter itself: scrapes, spans in and rejected, OTLP requests refused, label "
        "sets past --max-series, forwarding to --forward-otlp.",
        EXPORTER_CHAIN,
    )
    board.with_row(row("Scrapes"))
    board.with_panel(
        stat_panel(
            "Up",
            "1 while Prometheus can scrape the exporter.",
            [query(f"max by (instance) (up{EXPORTER})", "{{instance}}")],
            "bool_yes_no",
        )
    )
    board.with_panel(
        stat_panel(
            "Version",
            "gpuscope version each exporter runs.",
            [
                query(
                    f"max by (instance, {VERSION}) ({series(exporter_rows.BUILD_INFO)}{EXPORTER})",
                    "{{instance}} {{version}}",
                )
            ],
            "none",
            text_mode=BigValueTextMode.NAME,
        )
    )
    board.with_panel(
        timeseries(
            "Scrape duration",
            "How long Prometheus took to scrape /metrics.",
            [query(f"max by (instance) (scrape_duration_seconds{EXPORTER})", "{{instance}}")],
            "s",
            QUARTER,
        )
    )
    board.with_panel(
        timeseries(
            "Samples per scrape",
            "Samples in each scrape: grows with the label sets the request metrics hold.",
            [query(f"max by (instance) (scrape_samples_scraped{EXPORTER})", "{{instance}}")],
            "short",
            QUARTER,
        )
    )
    board.with_row(row("Spans"))
    board.with_panel(
        timeseries(
            "Spans received",
            "Spans per second in decoded OTLP export requests.",
            [query(per_second(exporter_rows.SPANS_RECEIVED, "instance"), "{{instance}}")],
            "ops",
            THIRD,
        )
    )
    board.with_panel(
        timeseries(
            "Spans rejected by reason",
            "Spans per second dropped for breaking the span contract (bad ids, durations, "
            "attribute types, over-long labels).",
            [query(per_second(exporter_rows.SPANS_REJECTED, REASON), "{{reason}}")],
            "ops",
            THIRD,
            stacked=True,
        )
    )
    board.with_panel(
        timeseries(
            "OTLP requests rejected by reason",
            "Export requests per second refused as a whole (too large, bad encoding, "
            "unauthorized).",
            [query(per_second(exporter_rows.OTLP_REQUESTS_REJECTED, REASON), "{{reason}}")],
            "reqps",
            THIRD,
            stacked=True,
        )
    )
    board.with_row(row("Connections"))
    board.with_panel(
        timeseries(
            "Open connections",
            "Client connections open now (busy: a request is being handled; idle: kept "
            "alive between requests), against the cap --max-connections fitted to the "
            "descriptor limit. At the cap, new connections are refused or idle ones shed.",
            [
                query(
                    f"sum by (instance, {CONNECTION_STATE}) "
                    f"({series(exporter_rows.HTTP_CONNECTIONS)}{EXPORTER})",
                    "{{instance}} {{state}}",
                ),
                query(
                    f"max by (instance) ({series(exporter_rows.HTTP_CONNECTIONS_MAX)}{EXPORTER})",
                    "{{instance}} cap",
                ),
            ],
            "short",
            HALF,
        )
    )
    board.with_panel(
        timeseries(
            "Connections closed by the exporter",
            "Connections per second the exporter closed, by reason (idle or header "
            "timeouts, refused or shed at the cap, stalled writes): a rise means slow or "
            "too many clients, and spans they carried may be lost.",
            [query(per_second(exporter_rows.HTTP_CONNECTIONS_CLOSED, REASON), "{{reason}}")],
            "ops",
            HALF,
            stacked=True,
        )
    )
    board.with_row(row("Limits and forwarding"))
    board.with_panel(
        timeseries(
            "Series overflow",
            "Observations per second sent to a metric's overflow series because it hit "
            "--max-series: raise the limit or find the sender with unbounded labels.",
            [query(per_second(exporter_rows.SERIES_OVERFLOW, OVERFLOWED_METRIC), "{{metric}}")],
            "ops",
            HALF,
            stacked=True,
        )
    )
    board.with_panel(
        timeseries(
            "Forwarding",
            "Spans per second forwarded to --forward-otlp (Tempo, Jaeger) and dropped, by "
            "reason. Only exporters started with --forward-otlp have these series.",
            [
                query(
                    per_second(exporter_rows.FORWARD_SPANS_SENT, "instance"), "{{instance}} sent"
                ),
                query(
                    per_second(exporter_rows.FORWARD_SPANS_DROPPED, REASON), "dropped: {{reason}}"
                ),
            ],
            "ops",
            HALF,
        )
    )
    return board
