"""deploy/grafana and deploy/prometheus hold together: the dashboard is a valid Grafana model whose every
query reads only series the gateway exports, and promtool accepts the scrape config and alert rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .conftest import MakeGateway, chat, settle

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "gateway-dashboard.json"
PROMETHEUS = DEPLOY / "prometheus"
PANEL_TYPES = frozenset({"row", "timeseries", "stat", "bargauge", "table", "gauge"})
# Words in PromQL that are not series names.
PROMQL_WORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
    | {"inf", "nan"}
)


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression reads (not functions, labels, keywords or numbers)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # label values
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = re.findall(r"(?<![\w$.])([A-Za-z_:][\w:]*)\b(?!\s*\()", text)
    return {n for n in names if n.lower() not in PROMQL_WORDS}


def panel_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def exported_series(exposition: str) -> set[str]:
    """Every series name the exposition declares, samples or not (a labelled counter has none until
    it first counts): counters end in _total, histograms have _bucket, _sum and _count."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    families = text_string_to_metric_families(exposition)
    return {f.name + suffix for f in families for suffix in suffixes[f.type]}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_the_dashboard_is_a_grafana_model(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in dashboard["panels"]:
        assert panel["type"] in PANEL_TYPES and panel["title"]
        grid = panel["gridPos"]
        assert set(grid) == {"x", "y", "w", "h"} and grid["x"] + grid["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], f"{panel['title']} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"] for t in panel["targets"])


def test_the_parser_sees_series_and_nothing_else() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, backend) (rate(gateway_ttft_seconds_bucket{x="a b"}[5m])))'
    assert series_in(expr) == {"gateway_ttft_seconds_bucket"}
    assert series_in("(a_total + b) / c > 0.9 and c > 0") == {"a_total", "b", "c"}
    assert series_in("increase(x_total[$__range]) * 3600") == {"x_total"}


def test_every_query_reads_only_series_the_gateway_exports(
    dashboard: dict[str, Any], make_gateway: MakeGateway
) -> None:
    routes = """
  vllm-only:
    backends: [b300-vllm]
  capped:
    backends: [paid-api]
    budgets: {per_day_usd: 1, per_month_usd: 10}
"""
    gateway = make_gateway(routes)
    chat(gateway, "vllm-only", stream=True)
    chat(gateway, "capped")
    settle(gateway, 2)
    exposition = httpx.get(gateway.url + "/metrics").text
    exported = exported_series(exposition)
    rules = yaml.safe_load((PROMETHEUS / "gateway-rules.yml").read_text())
    queries = panel_exprs(dashboard) + [
        (rule["alert"], rule["expr"]) for group in rules["groups"] for rule in group["rules"]
    ]
    assert len(queries) > 20
    unknown = {(where, name) for where, expr in queries for name in series_in(expr) - exported}
    assert not unknown, f"queries read series the gateway does not export: {sorted(unknown)}"
    read = {name for _, expr in queries for name in series_in(expr)}
    for name in ("gateway_spend_usd_total", "gateway_budget_limit_usd", "gateway_ttft_seconds_bucket"):
        assert name in read


def test_promtool_accepts_the_scrape_config_and_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install -y prometheus); CI installs it")
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "gateway-rules.yml"]):
        checked = subprocess.run(
            [promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
