"""``gptrmctl nodes NODE``: the GPU topology matrix, NUMA nodes and CPU lists, human and JSON."""

from __future__ import annotations

from agent.collectors.simulated import SimulatedGpus
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.ctl import human, render
from tests.helpers.ctl_schema import validate


def node_view(topology: str) -> admin_pb2.NodeView:
    """A node whose inventory is what a simulated agent with this topology sends."""
    gpus = SimulatedGpus("8xH100-80GB", "n1", topology=topology, cpus=range(32))
    inv = types_pb2.NodeInventory(node_id="n1", hostname="h", cpu_cores=32, simulated=True, gpu_backend="simulated")
    inv.gpus.extend(d.to_proto() for d in gpus.devices())
    return admin_pb2.NodeView(record=types_pb2.NodeRecord(inventory=inv), state=types_pb2.NODE_STATE_READY)


class TestTopologyShown:
    def test_json_pairs_server(self) -> None:
        """-o json: the matrix, each GPU's NUMA node, CPUs and links; it validates against node.json."""
        doc = render.node_dict(node_view("pcie-nvlink-pairs"))
        validate(doc, "node")
        assert doc["topology"][0] == ["X", "NV4", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
        assert doc["topology"][5][4] == "NV4"
        g4 = doc["gpus"][4]
        assert (g4["numa_node"], g4["cpu_list"], g4["cpu_affinity"][0]) == (1, "16-31", 16)
        assert g4["links"][5 - 1] == {"peer_index": 5, "level": "nvlink", "nvlinks": 4, "code": "NV4"}
        assert "numa_node_plus_one" not in g4

    def test_human_matrix(self) -> None:
        """The human view prints nvidia-smi's matrix with NUMA and CPUS columns and a legend."""
        text = human.node_detail(render.node_dict(node_view("hgx")))
        lines = text.split("topology\n", 1)[1].splitlines()
        assert lines[0].split() == [*(f"GPU{i}" for i in range(8)), "NUMA", "CPUS"]
        assert lines[1].split() == ["GPU0", "X", *["NV18"] * 7, "0", "0-15"]
        assert lines[8].split() == ["GPU7", *["NV18"] * 7, "X", "1", "16-31"]
        assert "NV# = # NVLinks" in lines[-1] and "SYS = across sockets" in lines[-1]

    def test_unknown_topology(self) -> None:
        """Nothing known: null in JSON, no section in the human view."""
        doc = render.node_dict(node_view("none"))
        validate(doc, "node")
        assert doc["topology"] is None and doc["gpus"][0]["numa_node"] is None and doc["gpus"][0]["cpu_list"] == ""
        assert "topology" not in human.node_detail(doc)
