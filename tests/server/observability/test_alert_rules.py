"""deploy/prometheus rules name metrics the coordinator exports and runbook sections that exist."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from streamkit_server.observability.metrics import Metrics

ROOT = Path(__file__).parents[3]


def test_alert_rules_name_real_metrics_and_runbooks() -> None:
    exported = {m.name for m in Metrics().registry.collect()}
    operations = (ROOT / "docs" / "operations.md").read_text()
    anchors = {
        re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", operations, re.M)
    }
    rules = [
        rule
        for path in (ROOT / "deploy" / "prometheus").glob("*.yaml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]
    assert rules
    for rule in rules:
        named = set(re.findall(r"redis_stream_coord_\w+", rule["expr"]))
        assert named and named <= exported, (rule["alert"], named - exported)
        anchor = rule["annotations"]["runbook_url"].partition("#")[2]
        assert anchor in anchors, (rule["alert"], anchor)
