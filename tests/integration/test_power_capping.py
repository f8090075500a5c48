"""End to end: with --power-capping on, the leader lowers an idle simulated GPU's power limit through the agent,
and a task that asks for full power gets its GPU's maximum back."""

from __future__ import annotations

import json

from tests.integration.harness import Cluster, wait_until

MIN_W, MAX_W = 200.0, 700.0   # the simulated H100's NVML range


def _gpus(c: Cluster, node: str) -> list[dict]:
    """The node's GPUs as ``gptrmctl nodes NODE -o json`` shows them (none before it registered)."""
    res = c.ctl("-o", "json", "nodes", node)
    if res.returncode != 0 and "not found" in res.stderr:
        return []
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["gpus"]


def _limits(c: Cluster, node: str) -> dict[int, float]:
    """GPU index → the enforced limit the agent's telemetry reports (absent before the first sample)."""
    return {g["index"]: g["telemetry"]["power_limit_w"] for g in _gpus(c, node)
            if g["telemetry"] and g["telemetry"].get("power_limit_w")}


class TestPowerCapping:
    def test_idle_gpu_limit_goes_down_and_full_power_task_restores_it(self, cluster: Cluster) -> None:
        """Idle GPUs are stepped down within their range (draw under the limit); a --full-power task's GPU is
        restored to its maximum."""
        cluster.start_coordinator("c1", "--power-capping", "on", "--power-cap-interval", "1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1")
        lowered = wait_until(lambda: x if len(x := _limits(cluster, "n1")) == 4 and max(x.values()) < MAX_W - 100
                             else None, timeout_s=60, interval_s=0.5, what="every idle GPU's limit lowered")
        assert all(MIN_W <= w < MAX_W for w in lowered.values())
        for g in _gpus(cluster, "n1"):
            t = g["telemetry"]
            assert t["power_w"] <= t["power_limit_w"] + 1e-6
        events = [json.loads(line) for line in cluster.ctl("-o", "json", "events").stdout.splitlines()]
        caps = [e for e in events if e["kind"] == "power" and "before_w" in e["fields"]]
        assert caps and all(float(e["fields"]["after_w"]) < float(e["fields"]["before_w"]) for e in caps)

        res = cluster.ctl("-o", "json", "submit", "--name", "full", "--gpus", "1", "--gpu-mem-gib", "10",
                          "--cpu", "0.1", "--full-power", "--", "sleep", "60")
        assert res.returncode == 0, res.stderr
        tid = json.loads(res.stdout)["task_id"]

        def placed() -> list[int] | None:
            t = json.loads(cluster.ctl("-o", "json", "tasks", tid).stdout)
            return t["allocation"][0]["gpu_indices"] if t["state"] == "running" else None

        [gpu] = wait_until(placed, timeout_s=60, interval_s=0.5, what="full-power task running")
        wait_until(lambda: _limits(cluster, "n1").get(gpu) == MAX_W, timeout_s=60, interval_s=0.5,
                   what="the task's GPU back at its maximum")
        cluster.ctl("cancel", tid)
