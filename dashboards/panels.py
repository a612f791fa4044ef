"""What every gpuscope dashboard shares: data source, chained variables, panel factories.

Panels are built with grafana-foundation-sdk's builders. A panel's queries all go
to the ``$datasource`` Prometheus; every request-side query aggregates with an
explicit ``sum by (...)`` so that a label the exporter adds later (an operation,
say) cannot split a series the panel expects to be one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import (
    dashboard,
    gauge,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    table,
    text,
)
from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DashboardSpecialValueMapOptions,
    DataSourceRef,
    DataTransformerConfig,
    SpecialValueMap,
    SpecialValueMatch,
    Threshold,
    ThresholdsMode,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat
from grafana_foundation_sdk.models.text import TextMode

from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract import gpu as gpu_rows
from pack.contract import GPU_INDEX, MODEL, ROUTE, SERVICE, series
from pack.engines import NO_TRAFFIC, SCRAPED_ENGINE_SERIES
from pack.recorded import SOURCE_SERIES

TAGS = ["gpuscope"]
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"

# Variable sources: the exporter's own info series, then the request histogram whose
# label set is the widest (it alone has ``route``).
BUILD_INFO = series(exporter_rows.BUILD_INFO)
REQUESTS = series(exporter_rows.REQUEST_DURATION, "count")
GPU_INFO = series(gpu_rows.INFO)


@dataclass(frozen=True)
class Variable:
    """A query variable: ``label`` values of ``metric``, filtered by the variables before.

    ``single``: one value at a time, no "All" (a panel that would add up what two
    values count, like two sources of the same requests, needs one).
    """

    name: str
    title: str
    metric: str
    single: bool = False


# The chains each dashboard uses; a dashboard's variables filter in this order.
EXPORTER_CHAIN = (Variable("job", "Job", BUILD_INFO), Variable("instance", "Instance", BUILD_INFO))
# The GPU board's targets and GPUs from the GPU info series, which gpuscope's exporter
# serves and the rules over dcgm-exporter record alike (dcgm-exporter serves no
# gpuscope_build_info).
GPU_CHAIN = (
    Variable("job", "Job", GPU_INFO),
    Variable("instance", "Instance", GPU_INFO),
    Variable(GPU_INDEX, "GPU", GPU_INFO),
)
# The scrape targets of the inference latency board: the exporter's and every serving
# engine's own /metrics (the worker, vLLM and each engine of the engines table, by a
# series each always serves), so that $job and $instance pick the environment's workers
# and engines as well as its exporters; then the routes of gpuscope's spans.
SCRAPED = '{__name__=~"' + "|".join(dict.fromkeys([BUILD_INFO, *SCRAPED_ENGINE_SERIES])) + '"}'
SCRAPE_CHAIN = (
    Variable("job", "Job", SCRAPED),
    Variable("instance", "Instance", SCRAPED),
    Variable(ROUTE, "Route", REQUESTS),
)
# The recording rules' per-source series (spans and engines' own /metrics alike): the
# source, then the host (a scrape target's instance without its port), service, model
# and GPU of the requests.
SOURCE = Variable("source", "Source", SOURCE_SERIES)
SOURCE_CHAIN = (
    Variable("source", "Source", SOURCE_SERIES, single=True),
    Variable("host", "Host", SOURCE_SERIES),
    Variable(SERVICE, "Service", SOURCE_SERIES),
    Variable(MODEL, "Model", SOURCE_SERIES),
    Variable(GPU_INDEX, "GPU", SOURCE_SERIES),
)
# The inference latency board's requests, from the same per-source series: every
# source's services and models (an engine's own /metrics name no route or exporter),
# each source's rows showing its own.
REQUEST_CHAIN = (
    SOURCE,
    Variable(SERVICE, "Service", SOURCE_SERIES),
    Variable(MODEL, "Model", SOURCE_SERIES),
    Variable(GPU_INDEX, "GPU", SOURCE_SERIES),
)


def filtered(metric: str, *names: str) -> str:
    """``metric`` filtered by variables ``names``; a bare selector of its own
    (``{__name__=~"..."}``) takes their matchers inside it."""
    sel = selector(*names)
    if not metric.endswith("}"):
        return metric + sel
    return metric[:-1] + (", " + sel[1:] if names else "}")


def selector(*names: str, extra: Sequence[str] = ()) -> str:
    """``{a=~"$a", b=~"$b", ...extra}`` for variables ``names`` plus literal matchers."""
    return "{" + ", ".join([*(f'{name}=~"${name}"' for name in names), *extra]) + "}"


AnyVariable = dashboard.DatasourceVariable | dashboard.QueryVariable


def variables(*chains: Sequence[Variable]) -> list[AnyVariable]:
    """The ``datasource`` variable, then each chain's variables, each filtered by those
    before it in its chain.

    Every variable but a ``single`` one is multi-valued with an "All" of ``.*``, so a
    series whose label is empty (a request that named no GPU) still matches "All".
    """
    built: list[AnyVariable] = [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    ]
    for chain in chains:
        for index, variable in enumerate(chain):
            before = [v.name for v in chain[:index]]
            query = f"label_values({filtered(variable.metric, *before)}, {variable.name})"
            built.append(
                dashboard.QueryVariable(variable.name)
                .label(variable.title)
                .datasource(DATASOURCE)
                .query(query)
                .definition(query)
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(VariableSort.NATURAL_ASC)
                .multi(not variable.single)
                .include_all(not variable.single)
            )
            if not variable.single:
                built[-1].all_value(".*")
    return built


def new_dashboard(
    uid: str,
    title: str,
    description: str,
    chain: Sequence[Variable],
    *also: Sequence[Variable],
) -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard.DashboardLink("gpuscope")
            .type(DashboardLinkType.DASHBOARDS)
            .tags(TAGS)
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for variable in variables(chain, *also):
        board.with_variable(variable)
    return board.annotation(firing_alerts())


# Alerts Prometheus evaluates as firing (its ALERTS series, from the rules of alerts/):
# marked on every board's time axis, so a latency step and the alert that explains it
# (a lost GPU, an XID, throttling) are read together.
FIRING_ALERTS = 'ALERTS{alertstate="firing"}'


def firing_alerts() -> dashboard.AnnotationQuery:
    return (
        dashboard.AnnotationQuery()
        .name("Firing alerts")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("red")
        .expr(FIRING_ALERTS)
        .title_format("{{alertname}}")
        .text_format("{{severity}}: {{job}} {{instance}} {{service}} {{model}} GPU {{gpu}}")
        .tag_keys("alertname,severity")
        .step("60s")
    )


def ratio(numerator: str, denominator: str, matching: str = "") -> str:
    """``numerator / denominator`` where the denominator is above 0, as the rules guard:
    an idle window (0 / 0) draws nothing rather than NaN. ``matching`` is the
    operator's modifier (``ignoring (phase) group_left``)."""
    operator = f"/ {matching}" if matching else "/"
    return f"{numerator}\n{operator}\n({denominator} > 0)"


def quantile(q: float, buckets: str) -> str:
    """``histogram_quantile`` of per-second bucket rates, without the NaN of a window with
    no observations (NaN compares false with everything; latencies are never below 0)."""
    return f"(histogram_quantile({q}, {buckets}) >= 0)"


def query(expr: str, legend: str = "", *, exemplar: bool = False) -> prometheus.Dataquery:
    target = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").range()
    if exemplar:
        target.exemplar(True)
    return target


@dataclass(frozen=True)
class Size:
    width: int = 12
    height: int = 8


HALF = Size()
THIRD = Size(8, 8)
QUARTER = Size(6, 6)
FULL = Size(24, 8)


def timeseries(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    unit: str,
    size: Size = HALF,
    *,
    stacked: bool = False,
    max_value: float | None = None,
    decimals: int | None = None,
    no_value: str | None = None,
    steps: dashboard.ThresholdsConfig | None = None,
) -> timeseries_builders.Panel:
    panel = (
        timeseries_builders.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .min(0)
        .span(size.width)
        .height(size.height)
        .fill_opacity(30 if stacked else 10)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if stacked:
        panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if max_value is not None:
        panel.max(max_value)
    if decimals is not None:
        panel.decimals(decimals)
    if no_value is not None:
        panel.no_value(no_value)
    if steps is not None:  # drawn as lines: the limits a rule compares the series with
        panel.thresholds(steps).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)
        )
    for target in targets:
        panel.with_target(target)
    return panel


def thresholds(base: str, *steps: tuple[float, str]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds: ``base`` colour from the bottom, then each (value, colour)."""
    return (
        dashboard.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(None, base), *(Threshold(value, color) for value, color in steps)])
    )


# A stat over an idle window reads "No traffic": its query returns nothing (every ratio
# and quantile drops the 0/0), and a NaN that still arrives is written the same way.
NO_TRAFFIC_MAPPINGS = [
    SpecialValueMap(
        DashboardSpecialValueMapOptions(
            SpecialValueMatch.NULL_AND_NAN, ValueMappingResult(text=NO_TRAFFIC)
        )
    )
]


def stat_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    unit: str,
    size: Size = QUARTER,
    *,
    text_mode: common.BigValueTextMode = common.BigValueTextMode.VALUE_AND_NAME,
    steps: dashboard.ThresholdsConfig | None = None,
    no_value: str | None = None,
    graph: bool = True,
) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(size.width)
        .height(size.height)
        .text_mode(text_mode)
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA if graph else common.BigValueGraphMode.NONE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if steps is not None:
        panel.thresholds(steps)
    if no_value is not None:
        panel.no_value(no_value).mappings(list(NO_TRAFFIC_MAPPINGS))
    for target in targets:
        panel.with_target(target.instant())
    return panel


def gauge_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    unit: str,
    steps: dashboard.ThresholdsConfig,
    size: Size,
    *,
    low: float,
    high: float,
) -> gauge.Panel:
    panel = (
        gauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .min(low)
        .max(high)
        .span(size.width)
        .height(size.height)
        .thresholds(steps)
        .show_threshold_markers(True)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    for target in targets:
        panel.with_target(target.instant())
    return panel


def table_panel(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    columns: dict[str, str],
    size: Size = FULL,
) -> table.Panel:
    """Instant queries in table form, merged into one row per label set; ``columns``
    renames the merged fields (``Value #B`` ...) and drops every field it does not name
    but the labels."""
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit("none")
        .span(size.width)
        .height(size.height)
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value #A": True},
                    "renameByName": columns,
                },
            )
        )
    )
    for target in targets:
        panel.with_target(target.instant().format(PromQueryFormat.TABLE))
    return panel


def state_timeline(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    size: Size = HALF,
    *,
    no_value: str | None = None,
) -> statetimeline.Panel:
    panel = (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit("bool_on_off")
        .span(size.width)
        .height(size.height)
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
    )
    if no_value is not None:
        panel.no_value(no_value)
    for target in targets:
        panel.with_target(target)
    return panel


def heatmap_panel(
    title: str,
    description: str,
    target: prometheus.Dataquery,
    unit: str,
    size: Size = HALF,
    *,
    no_value: str = NO_TRAFFIC,
) -> heatmap.Panel:
    return (
        heatmap.Panel()
        .no_value(no_value)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(size.width)
        .height(size.height)
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(unit))
        .with_target(target.format(PromQueryFormat.HEATMAP).legend_format("{{le}}"))
    )


def text_panel(title: str, markdown: str, size: Size = FULL) -> text.Panel:
    """A note in Markdown: what a board cannot show, and why."""
    return (
        text.Panel()
        .title(title)
        .span(size.width)
        .height(size.height)
        .mode(TextMode.MARKDOWN)
        .content(markdown)
    )


def row(title: str, *, repeat: str | None = None) -> dashboard.Row:
    built = dashboard.Row(title)
    if repeat is not None:
        built.repeat(repeat)
    return built


def render(board: dashboard.Dashboard) -> str:
    """The dashboard as stable JSON: sorted keys, panel ids in reading order."""
    model = board.build()
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
        for ref_number, target in enumerate(getattr(panel, "targets", None) or []):
            target.ref_id = chr(ord("A") + ref_number)
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
