"""GPU topology end to end: a simulated two-socket server with NVLink-bridged pairs registers its
topology, the leader places 2-GPU tasks on whole pairs, and each task runs on its socket's CPUs."""

from __future__ import annotations

import json

from tests.integration.harness import Cluster, wait_until

PAIRS = ("--simulate-gpus", "8xH100-80GB", "--simulate-topology", "pcie-nvlink-pairs")


def _allowed(c: Cluster, task_id: str) -> str | None:
    out = c.ctl("logs", task_id).stdout
    line = next((x for x in out.splitlines() if x.startswith("Cpus_allowed_list")), None)
    return line.split(":", 1)[1].strip() if line else None


class TestGpuTopology:
    def test_pairs_server_end_to_end(self, cluster: Cluster) -> None:
        """Four 2-GPU tasks get the four bridged pairs; each is bound to its pair's socket's CPUs;
        gptrmctl shows the matrix."""
        cluster.start_coordinator("c1", "--threshold", "1")
        cluster.wait_leader("c1")
        cluster.start_agent("n1", *PAIRS)
        node = wait_until(lambda: (r := cluster.ctl("-o", "json", "nodes", "n1")).returncode == 0
                          and json.loads(r.stdout), what="node n1")
        assert node["topology"][0][:2] == ["X", "NV4"] and node["topology"][0][4] == "SYS"
        cpu_list = {g["index"]: g["cpu_list"] for g in node["gpus"]}
        ids = [cluster.submit("--name", f"pair{k}", "--gpus", "2", "--gpu-mem-gib", "10", "--cpu", "0.1", "--",
                       "sh", "-c", "grep Cpus_allowed_list /proc/self/status; exec sleep 60") for k in range(4)]
        tasks = [wait_until(lambda t=t: (d := cluster.task(t))["state"] == "running" and d, what=f"{t} running")
                 for t in ids]
        pairs = sorted(tuple(t["allocation"][0]["gpu_indices"]) for t in tasks)
        assert pairs == [(0, 1), (2, 3), (4, 5), (6, 7)]
        for t in tasks:
            first = t["allocation"][0]["gpu_indices"][0]
            assert wait_until(lambda t=t: _allowed(cluster, t["task_id"]), what="cpu list") == cpu_list[first]
        human = cluster.ctl("nodes", "n1").stdout
        assert "topology" in human and "NV4" in human and "SYS" in human
        for t in ids:
            assert cluster.ctl("cancel", t).returncode == 0
