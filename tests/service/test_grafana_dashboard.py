"""The commit service's Grafana dashboard (docs/grafana/delta-mirror-commit-service.json) names only
series the service exports, and imports like the mirror's dashboard beside it (same datasource input)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from delta_mirror.service.metrics import PREFIX, metric_names

GRAFANA = Path(__file__).resolve().parents[2] / "docs" / "grafana"
DASHBOARD = GRAFANA / "delta-mirror-commit-service.json"


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def test_each_panel_queries_series_the_service_exports() -> None:
    dashboard = _load(DASHBOARD)
    exported = set(metric_names())
    assert dashboard["panels"], "no panel"
    for panel in dashboard["panels"]:
        exprs = [t["expr"] for t in panel["targets"]]
        assert exprs, panel["title"]
        for expr in exprs:
            named = set(re.findall(r"\bdelta_mirror_\w+", expr))
            assert named, f"{panel['title']}: {expr} names no delta-mirror metric"
            assert all(n.startswith(PREFIX) for n in named), expr
            assert named <= exported, f"{panel['title']}: {sorted(named - exported)} not exported"
    for variable in dashboard["templating"]["list"]:
        assert set(re.findall(r"\bdelta_mirror_\w+", variable["query"])) <= exported


def test_the_dashboard_imports_beside_the_mirror_s_own() -> None:
    service, mirror = _load(DASHBOARD), _load(GRAFANA / "delta-mirror-dashboard.json")
    assert service["__inputs"] == mirror["__inputs"]
    assert service["uid"] != mirror["uid"] and service["tags"] == mirror["tags"]
    ids = [p["id"] for p in service["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in service["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
