"""deploy/prometheus: every alert parses as PromQL (promql-parser, a port of
Prometheus's own parser), names only metrics the coordinator exports, and
points at a runbook section of docs/operations.md that exists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from streamkit_server.observability.metrics import Metrics

ROOT = Path(__file__).parents[2]
RULES = sorted((ROOT / "deploy" / "prometheus").glob("*.yaml"))
OPERATIONS = ROOT / "docs" / "operations.md"


def alerts() -> list[dict[str, Any]]:
    found = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            found.extend(rule for rule in group["rules"] if "alert" in rule)
    return found


def exported() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names |= {family.name, f"{family.name}_total"} | {s.name for s in family.samples}
    return names


def selectors(expr: str) -> list[str]:
    names: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.append(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def anchor(heading: str) -> str:
    """GitHub's (and mkdocs') heading anchor."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_promised_alerts_exist() -> None:
    names = {rule["alert"] for rule in alerts()}
    assert {"StreamkitShardLagGrowing", "StreamkitGroupLagGrowing", "StreamkitRevokeStuck",
            "StreamkitMemberHeartbeatOld"} <= names  # fmt: skip


@pytest.mark.parametrize("rule", alerts(), ids=lambda rule: rule["alert"])
def test_alert_names_exported_metrics_and_has_a_runbook(rule: dict[str, Any]) -> None:
    names = selectors(rule["expr"])
    assert names, rule["expr"]
    unknown = set(names) - exported()
    assert not unknown, f"{rule['alert']} names metrics the coordinator does not export: {unknown}"
    url = rule["annotations"]["runbook_url"]
    path, _, fragment = url.partition("#")
    assert path == "docs/operations.md"
    text = OPERATIONS.read_text(encoding="utf-8")
    runbook = text[text.index("## Runbook") :]
    headings = {anchor(h): h for h in re.findall(r"^### (.+)$", runbook, re.M)}
    assert fragment in headings, f"{rule['alert']}: no runbook section #{fragment}"
    # The section names every metric the alert uses.
    section = runbook.split(f"### {headings[fragment]}", 1)[1].split("\n### ", 1)[0]
    for name in names:
        assert name in section, f"runbook #{fragment} does not mention {name}"


def test_a_misspelt_metric_would_be_caught() -> None:
    assert set(selectors("max(redis_stream_coord_shard_lagg) > 0")) - exported()
    with pytest.raises(ValueError):
        promql_parser.parse("max by (shard (redis_stream_coord_shard_lag)")
