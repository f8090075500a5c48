"""The Grafana dashboard shipped in systemd/ queries the coordinator's real metric names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
DASHBOARD = ROOT / "systemd" / "grafana-dashboard.json"
REQUIRED = (
    "gptrm_cluster_utilization_mean_ratio", "gptrm_cluster_utilization_stddev_ratio", "gptrm_cluster_power_watts",
    "gptrm_cluster_energy_joules_total", "gptrm_node_power_watts", "gptrm_node_utilization_ratio",
    "gptrm_gpu_power_watts", "gptrm_gpu_utilization_ratio", "gptrm_tasks", "gptrm_scheduler_decisions_total",
    "gptrm_scheduler_cycle_duration_seconds", "gptrm_queue_gpus", "gptrm_queue_tasks", "gptrm_queue_gpu_seconds_total",
    "gptrm_queue_budget_used_ratio",
)  # fmt: skip


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for p in data["panels"] for t in p.get("targets", [])]


class TestGrafanaDashboard:
    """systemd/grafana-dashboard.json: valid JSON with a panel per required metric."""

    @pytest.mark.parametrize("metric", REQUIRED)
    def test_metric_is_queried(self, metric: str) -> None:
        """Each required metric appears in some panel query."""
        assert any(re.search(rf"\b{metric}(_bucket)?\b", e) for e in expressions())

    def test_metrics_exist_in_the_coordinator(self) -> None:
        """Every gptrm_ name the dashboard queries is defined in the coordinator (counters as NAME_total)."""
        source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "coordinator").rglob("*.py"))
        names = {n.removesuffix("_bucket") for e in expressions() for n in re.findall(r"gptrm_[a-z_]+", e)}
        defined = set(re.findall(r'"(gptrm_[a-z_]+)"', source))
        defined |= {f"{n}_total" for n in defined}
        gauges = {f"gptrm_gpu_{s}" for s in re.findall(r'\("([a-z_]+)", "GPU', source)}
        assert names <= defined | gauges

    def test_queue_and_rates(self) -> None:
        """The queue panel selects pending tasks; decisions are a per-second rate over one minute."""
        joined = "\n".join(expressions())
        assert 'gptrm_tasks{state="pending"}' in joined
        assert "rate(gptrm_scheduler_decisions_total[1m])" in joined
