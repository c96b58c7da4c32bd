"""deploy/grafana: the dashboard's shape, its PromQL checked with the real promtool and against
the metrics chatsite and vLLM export, the provisioning examples, and the scrape config they read."""

import json
import re
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.utils import floatToGoString

from tests.deploy.test_prometheus import SAMPLE_SUFFIXES, promql_metric_names, run_promtool

DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY_DIR / "grafana" / "chatsite.json"
DATASOURCES = DEPLOY_DIR / "grafana" / "provisioning" / "datasources" / "chatsite.yml"
DASHBOARD_PROVIDERS = DEPLOY_DIR / "grafana" / "provisioning" / "dashboards" / "chatsite.yml"
PROMETHEUS_CONFIG = DEPLOY_DIR / "prometheus" / "prometheus.yml"

# What every panel and query reads: the datasource chosen at import (__inputs), or on a
# provisioned dashboard the datasource variable of the same name.
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
GRID_WIDTH = 24

# A concrete value for each variable the queries may use, so that each is plain PromQL: the
# dashboard's own variables, then Grafana's built-in intervals.
VARIABLE_VALUES = {
    "path": "direct",
    "engine": "scripted",
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")

# vLLM's metrics the dashboard reads, as its OpenAI-compatible server exports them on /metrics
# (vllm/v1/metrics/loggers.py: every one labelled model_name and engine, the engine index).
VLLM_METRICS = {
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
}
VLLM_LABELS = {"model_name", "engine"}


class Query(NamedTuple):
    panel_id: int
    title: str
    ref_id: str
    expr: str
    legend: str

    @property
    def rule_name(self) -> str:
        return f"dashboard:panel_{self.panel_id}_{self.ref_id}"


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included, rows themselves excluded."""
    found = []
    for panel in dashboard()["panels"]:
        found.extend(panel.get("panels", []) if panel["type"] == "row" else [panel])
    return found


def queries() -> list[Query]:
    return [
        Query(panel["id"], panel["title"], target["refId"], target["expr"], target["legendFormat"])
        for panel in panels()
        for target in panel["targets"]
    ]


def concrete(expr: str) -> str:
    """The expression with each variable replaced by a value from VARIABLE_VALUES."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in VARIABLE_VALUES:
            pytest.fail(f"${name} is neither a variable of the dashboard nor Grafana's: {expr}")
        return VARIABLE_VALUES[name]

    return VARIABLE.sub(value, expr)


def write_rules(tmp_path: Path, exprs: dict[str, str]) -> Path:
    """A rules file recording each expression under its key."""
    rules = [{"record": name, "expr": expr} for name, expr in exprs.items()]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


def check_expressions(promtool: str, tmp_path: Path, exprs: dict[str, str]) -> tuple[int, str]:
    """promtool's verdict on the expressions, written as recording rules named by the keys: it
    parses each expression and reports the rule of any it cannot parse."""
    result = run_promtool(promtool, "check", "rules", write_rules(tmp_path, exprs))
    return result.returncode, result.stdout + result.stderr


def metric_labels() -> dict[str, set[str]]:
    """Sample name on the wire (ai_ttft_seconds_bucket, ai_streams_total) -> its label names, for
    every metric assistant.metrics defines and the vLLM metrics above."""
    from assistant import metrics

    families = [
        (family.name, family.type, set(obj._labelnames))
        for obj in vars(metrics).values()
        if isinstance(obj, MetricWrapperBase)
        for family in obj.describe()
    ]
    families += [(name, kind, VLLM_LABELS) for name, kind in VLLM_METRICS.items()]
    return {
        name + suffix: labels | ({"le"} if suffix == "_bucket" else set())
        for name, kind, labels in families
        for suffix in SAMPLE_SUFFIXES[kind]
    }


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names matched) for each selector with braces in the expression."""
    return [
        (name, set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", matchers)))
        for name, matchers in re.findall(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr)
    ]


def grouping_labels(expr: str) -> set[str]:
    return {
        label.strip()
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr)
        for label in group.split(",")
        if label.strip()
    }


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not on PATH: install Debian's prometheus package "
            "(scripts/setup --test does) to check deploy/grafana."
        )
    return path


QUERIES = [pytest.param(q, id=q.rule_name) for q in queries()]


# --- the dashboard's shape ---------------------------------------------------------------------


def test_dashboard_is_importable() -> None:
    """Grafana can import the file: a uid and title, no id of another instance, a Prometheus
    datasource asked for at import, and the same name as a datasource variable so that a
    provisioned copy (which skips the import step) resolves it too."""
    board = dashboard()
    assert re.fullmatch(r"[\w-]{1,40}", board["uid"])
    assert board["title"]
    assert board["id"] is None
    assert board["schemaVersion"] >= 39
    (ds_input,) = board["__inputs"]
    assert ds_input == ds_input | {
        "name": "DS_PROMETHEUS",
        "type": "datasource",
        "pluginId": "prometheus",
    }
    variables = {var["name"]: var for var in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"


def test_panels_have_unique_ids_and_share_the_grid() -> None:
    """Each panel has its own id and title, and a place on the 24-column grid that no other
    panel takes."""
    every = dashboard()["panels"]
    every += [nested for panel in every for nested in panel.get("panels", [])]
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids)), ids
    titles = [panel["title"] for panel in every]
    assert len(titles) == len(set(titles)), titles
    cells: dict[tuple[int, int], str] = {}
    for panel in every:
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["y"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= GRID_WIDTH, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_panel_queries_the_chosen_datasource_with_a_unit() -> None:
    """Each panel, each of its queries and each query variable read ${DS_PROMETHEUS}; each panel
    has queries with distinct refIds and a unit for its values."""
    for panel in panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        targets = panel["targets"]
        assert targets, panel["title"]
        assert all(target["datasource"] == DATASOURCE for target in targets), panel["title"]
        assert len({target["refId"] for target in targets}) == len(targets), panel["title"]
        assert all(target["expr"].strip() for target in targets), panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]
    assert set(re.findall(r"\$\{(DS_\w+)\}", DASHBOARD.read_text())) == {"DS_PROMETHEUS"}


@pytest.mark.parametrize("name", ["path", "engine"])
def test_filter_variables_list_values_of_a_real_label(name: str) -> None:
    """$path and $engine offer the values of that label on ai_streams_total, any number of them
    at once; "All" is a regex matching every value, as the queries match with =~."""
    from assistant import metrics

    (var,) = [v for v in dashboard()["templating"]["list"] if v["name"] == name]
    match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["query"]["query"])
    assert match, var["query"]
    assert match.groups() == ("ai_streams_total", name)
    assert name in metrics.STREAMS._labelnames
    assert var["multi"] and var["includeAll"] and var["allValue"] == ".*"
    uses = [q.expr for q in queries() if f"${name}" in q.expr]
    assert uses
    assert all(f'{name}=~"${name}"' in expr for expr in uses)


# --- the queries -------------------------------------------------------------------------------


def test_queries_use_only_defined_variables() -> None:
    """Every $variable in a query is one of the dashboard's or one of Grafana's intervals."""
    defined = {var["name"] for var in dashboard()["templating"]["list"]} | BUILTIN_VARIABLES
    used = {m.group(1) or m.group(2) for q in queries() for m in VARIABLE.finditer(q.expr)}
    assert used
    assert used <= defined
    assert used <= VARIABLE_VALUES.keys()


def test_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    """promtool parses every query, its variables replaced by concrete values."""
    returncode, output = check_expressions(
        promtool, tmp_path, {q.rule_name: concrete(q.expr) for q in queries()}
    )
    assert returncode == 0, output
    assert f"{len(queries())} rules found" in output


def test_the_promql_check_rejects_a_broken_query(promtool: str, tmp_path: Path) -> None:
    """The same check fails on a query with a bracket missing, and names it."""
    first, *rest = queries()
    exprs = {q.rule_name: concrete(q.expr) for q in rest}
    exprs[first.rule_name] = concrete(first.expr).removesuffix(")")
    returncode, output = check_expressions(promtool, tmp_path, exprs)
    assert returncode != 0, output
    assert first.rule_name in output


@pytest.mark.parametrize("query", QUERIES)
def test_query_reads_exported_metrics(query: Query) -> None:
    """Every metric a query selects is one chatsite defines in assistant.metrics, with the suffix
    its type gets on the wire, or one of vLLM's, spelled as vLLM exports it."""
    names = promql_metric_names(concrete(query.expr))
    assert names, query.expr
    assert names - metric_labels().keys() == set()


@pytest.mark.parametrize("query", QUERIES)
def test_query_labels_exist(query: Query) -> None:
    """Each label a query matches on belongs to the metric it selects; each label it groups by
    or names in its legend belongs to one of its metrics. A label a metric lacks matches
    nothing, or draws every series under one blank name."""
    labels = metric_labels()
    expr = concrete(query.expr)
    found = selectors(expr)
    for name, matched in found:
        assert matched <= labels[name], f"{name} has no {matched - labels[name]}: {expr}"
    names = promql_metric_names(expr)
    available = set().union(*(labels[name] for name in names))
    grouped = grouping_labels(expr)
    assert grouped <= available, expr
    assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", query.legend)) <= grouped - {"le"}


def test_error_rates_count_the_server_faults() -> None:
    """The outcomes the error panels count as failures are exactly those chatsite records as the
    server's fault (engine_error, timeout, server_error); client_abort is not one."""
    from assistant.services.telemetry import SERVER_FAULTS

    regexes = {regex for q in queries() for regex in re.findall(r'outcome=~"([^"]*)"', q.expr)}
    assert regexes
    for regex in regexes:
        assert set(regex.split("|")) == SERVER_FAULTS


def test_ttft_edges_are_exported_buckets() -> None:
    """Each le a query selects on ai_ttft_seconds_bucket is a bucket edge, written the way
    prometheus_client writes it on /metrics (le="0.5", not "0.50")."""
    from assistant import metrics

    edges = {
        edge
        for q in queries()
        for edge in re.findall(r'ai_ttft_seconds_bucket\{[^}]*le="([^"]+)"', q.expr)
    }
    assert edges
    for edge in edges:
        assert float(edge) in metrics.TTFT_BUCKETS
        assert floatToGoString(float(edge)) == edge


def test_vllm_ttft_sits_beside_chatsite_ttft() -> None:
    """One panel shows vLLM's own TTFT P95 (vllm:time_to_first_token_seconds, per model_name)
    together with chatsite's engine and server TTFT."""
    by_panel: dict[int, list[str]] = {}
    for q in queries():
        by_panel.setdefault(q.panel_id, []).append(q.expr)
    (exprs,) = [e for e in by_panel.values() if any("vllm:time_to_first_token" in x for x in e)]
    joined = "\n".join(exprs)
    assert "histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:" in joined
    assert "ai_engine_ttft_seconds_bucket" in joined
    assert "ai_ttft_seconds_bucket" in joined


# --- what the panels show, on given series -----------------------------------------------------


def panel_query(title: str, ref_id: str = "A") -> Query:
    (query,) = [q for q in queries() if q.title == title and q.ref_id == ref_id]
    return query


def assert_panels_compute(
    promtool: str, tmp_path: Path, series: dict[str, str], expected: list[tuple[Query, str, float]]
) -> None:
    """promtool evaluates each panel query in ``expected`` on ``series`` (each a promtool
    expanding notation, one value a minute) at 10 minutes, and finds exactly the samples given
    for it (labels, value). Values compare in hundred-thousandths, rounded: whole numbers, so
    0.3 - 0.2 does not fail an exact comparison (and round() drops the metric name)."""
    samples: dict[Query, list[dict[str, Any]]] = {}
    for query, labels, value in expected:
        samples.setdefault(query, []).append({"labels": labels, "value": round(value * 100_000)})
    rules = write_rules(tmp_path, {q.rule_name: concrete(q.expr) for q in samples})
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": [
                    {
                        "expr": f"round(100000 * {q.rule_name})",
                        "eval_time": "10m",
                        "exp_samples": found,
                    }
                    for q, found in samples.items()
                ],
            }
        ],
    }
    (tmp_path / "dashboard.test.yml").write_text(yaml.safe_dump(tests))

    result = run_promtool(promtool, "test", "rules", tmp_path / "dashboard.test.yml")

    assert result.returncode == 0, result.stdout + result.stderr


def test_panels_compute_what_they_say(promtool: str, tmp_path: Path) -> None:
    """On known counters the panels read: 5 % of streams failed (3 engine errors and 2 timeouts
    in 100; 5 client aborts are not failures), chatsite added 100 ms to a 200 ms engine TTFT on
    average, and two hosts' active streams add up."""
    labels = 'job="chatsite",path="direct",engine="scripted"'
    host1, host2 = 'instance="10.0.0.1:8001"', 'instance="10.0.0.2:8001"'
    series = {
        f'ai_streams_total{{{labels},{host1},outcome="ok"}}': "0+90x20",
        f'ai_streams_total{{{labels},{host1},outcome="client_abort"}}': "0+5x20",
        f'ai_streams_total{{{labels},{host1},outcome="engine_error"}}': "0+3x20",
        f'ai_streams_total{{{labels},{host1},outcome="timeout"}}': "0+2x20",
        f'ai_ttft_seconds_sum{{{labels},{host1},source="server"}}': "0+30x20",
        f'ai_ttft_seconds_count{{{labels},{host1},source="server"}}': "0+100x20",
        f"ai_engine_ttft_seconds_sum{{{labels},{host1}}}": "0+20x20",
        f"ai_engine_ttft_seconds_count{{{labels},{host1}}}": "0+100x20",
        f"ai_streams_active{{{labels},{host1}}}": "3+0x20",
        f"ai_streams_active{{{labels},{host2}}}": "4+0x20",
    }
    assert_panels_compute(
        promtool,
        tmp_path,
        series,
        [
            (panel_query("Streams failed on the server's side, by path"), '{path="direct"}', 0.05),
            (panel_query("Latency added per stage (mean)", "B"), '{path="direct"}', 0.1),
            (panel_query("Active streams"), '{engine="scripted",path="direct"}', 7),
        ],
    )


def test_the_servers_panels_tell_daphne_from_uvicorn(promtool: str, tmp_path: Path) -> None:
    """On one host's figures, with both pools' series side by side: Daphne's streams failed 5 %
    of the time and uvicorn's 1 %; Daphne's gaps all fell in (5, 10] ms and uvicorn's in
    (10, 20] ms, so their P95s are 9.75 and 19.5 ms; Daphne's two workers have 3 and 4 streams
    open and uvicorn's one 5; Daphne's completed answers took (1, 2] s and uvicorn's (2, 4] s, so
    their P95s are 1.95 and 3.9 s (a failed answer's duration is left out)."""
    labels = 'job="chatsite",instance="10.0.0.1:8001",path="direct",engine="scripted"'
    daphne, uvicorn = f'{labels},server="daphne"', f'{labels},server="uvicorn"'
    series = {
        f'ai_streams_total{{{daphne},outcome="ok"}}': "0+95x20",
        f'ai_streams_total{{{daphne},outcome="timeout"}}': "0+5x20",
        f'ai_streams_total{{{uvicorn},outcome="ok"}}': "0+90x20",
        f'ai_streams_total{{{uvicorn},outcome="client_abort"}}': "0+9x20",
        f'ai_streams_total{{{uvicorn},outcome="server_error"}}': "0+1x20",
    }
    for server, bucket in ((daphne, "0.01"), (uvicorn, "0.02")):
        for le in ("0.005", "0.01", "0.02", "+Inf"):
            reached = float(le) >= float(bucket)
            series[f'ai_inter_token_seconds_bucket{{{server},le="{le}"}}'] = (
                "0+100x20" if reached else "0+0x20"
            )
    for server, port, streams in ((daphne, 8001, 3), (daphne, 8002, 4), (uvicorn, 8003, 5)):
        worker = server.replace(":8001", f":{port}") + f',pid="{port}"'
        series[f"ai_streams_active{{{worker}}}"] = f"{streams}+0x20"
    for server, outcome, bucket in (
        (daphne, "ok", "2"),
        (uvicorn, "ok", "4"),
        (uvicorn, "timeout", "1"),
    ):
        for le in ("1", "2", "4", "+Inf"):
            reached = float(le) >= float(bucket)
            name = f'ai_stream_duration_seconds_bucket{{{server},outcome="{outcome}",le="{le}"}}'
            series[name] = "0+100x20" if reached else "0+0x20"
    failed = panel_query("Streams failed on the server's side, by server")
    gaps = panel_query("Inter-token latency P95 by server")
    open_now = panel_query("Streams open by server")
    duration = panel_query("Stream duration P95 by server (completed streams)")
    assert_panels_compute(
        promtool,
        tmp_path,
        series,
        [
            (failed, '{server="daphne"}', 0.05),
            (failed, '{server="uvicorn"}', 0.01),
            (gaps, '{server="daphne"}', 0.00975),
            (gaps, '{server="uvicorn"}', 0.0195),
            (open_now, '{server="daphne"}', 7),
            (open_now, '{server="uvicorn"}', 5),
            (duration, '{server="daphne"}', 1.95),
            (duration, '{server="uvicorn"}', 3.9),
        ],
    )


# --- provisioning and the scrape config --------------------------------------------------------


def test_provisioning_examples_point_at_prometheus_and_the_dashboard() -> None:
    """The datasource is the default Prometheus one (the dashboard's variable starts on it) and
    assumes Prometheus's scrape interval; the dashboard provider reads a folder of JSON files."""
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert source["type"] == "prometheus"
    assert source["isDefault"] is True
    scrape_interval = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape_interval

    (provider,) = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")
    assert f"{provider['options']['path']}/{DASHBOARD.name}" in DASHBOARD_PROVIDERS.read_text()


def test_chatsite_is_scraped_once_per_host() -> None:
    """Each chatsite worker's /metrics returns its whole host's figures, so the chatsite job has
    one target per host (two workers of one host listed would double every sum); vLLM is its own
    job, on a port no chatsite target uses."""
    jobs = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    }
    hosts = [target.rsplit(":", 1)[0] for target in jobs["chatsite"]]
    assert hosts
    assert len(hosts) == len(set(hosts)), jobs["chatsite"]
    assert jobs["vllm"]
    assert not set(jobs["vllm"]) & set(jobs["chatsite"])
