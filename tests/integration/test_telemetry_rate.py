"""Telemetry rate end to end: a coordinator over its ingest budget asks two real agents for summaries at a
longer interval; they send them, stay READY, and status and metrics show the interval."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from common.pb.gptrm.v1 import admin_pb2
from tests.integration.harness import Cluster, wait_until

NODES = ("rate-1", "rate-2")


def _gauge(cluster: Cluster, name: str) -> float | None:
    text = urllib.request.urlopen(f"http://{cluster.metrics_address()}/metrics", timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return None


class TestTelemetryRate:
    def test_agents_summarise_at_the_interval_in_force_and_stay_ready(self, cluster: Cluster) -> None:
        # 2 nodes at 0.4 samples/s of budget: 2 / 0.4 = 5 s, one of the steps.
        cluster.start_coordinator("c1", "--ingest-budget", "0.4")
        cluster.wait_leader("c1")
        for node in NODES:
            cluster.start_agent(node)   # samples every 0.5 s
        status = wait_until(lambda: (d := cluster.ctl_json("status"))["telemetry_rate"]["report_interval_s"] == 5.0
                            and d["telemetry_rate"]["reporting_nodes"] == 2 and d, timeout_s=30,
                            what="a 5 s report interval for 2 nodes")
        assert status["telemetry_rate"]["ingest_budget_per_s"] == 0.4
        assert status["telemetry_rate"]["sampling_interval_s"] == 1.0
        assert "telemetry     every 5 s (summaries of 1 s samples), 2 nodes reporting" in cluster.ctl("status").stdout
        assert _gauge(cluster, "gptrm_telemetry_report_interval_seconds") == 5.0

        # Two full summaries per node, each of ~10 samples over ~5 s; both nodes READY at every look meanwhile.
        stub = cluster.admin()
        summaries: dict[str, set[float]] = {n: set() for n in NODES}

        def two_summaries_each() -> bool:
            for node in NODES:
                assert cluster.ctl_json("nodes", node)["state"] == "ready", f"{node} left READY"
                view = stub.GetNode(admin_pb2.GetNodeRequest(node_id=node), timeout=2)
                s = view.latest
                if view.has_latest and s.summarised_samples >= 8 and 4.0 <= s.summary_of_s <= 6.0:
                    assert s.gpus and s.gpus[0].HasField("util_gpu_max") and s.gpus[0].HasField("power_w_max")
                    assert s.gpus[0].power_w_max >= s.gpus[0].power_w
                    summaries[node].add(s.time_unix_s)
            return all(len(t) >= 2 for t in summaries.values())

        wait_until(two_summaries_each, timeout_s=45, interval_s=0.5, what="two summaries from each agent")
        # Two summaries 5 s apart: the nodes were silent up to ~5 s at a time, more than the 3 s that three
        # 1 s heartbeat intervals allow, and stayed READY at every look (the agents' heartbeats follow the interval).
        nodes_by_state = cluster.ctl_json("status")["nodes_by_state"]
        assert nodes_by_state == {"ready": 2}
