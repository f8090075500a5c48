"""The agent gateway's register check: unusable inventories are refused before anything is recorded."""

from __future__ import annotations

import pytest

from common.errors import ValidationError
from common.pb.gptrm.v1 import agent_pb2
from coordinator.api.gateway import MAX_GPUS, validate_register


def _register(node_id: str, gpus: int = 1) -> agent_pb2.Register:
    reg = agent_pb2.Register()
    reg.inventory.node_id = node_id
    for i in range(gpus):
        reg.inventory.gpus.add(index=i, power_limit_w=700)
    return reg


class TestValidateRegister:
    @pytest.mark.parametrize("node_id", ["a\x1bb", "new\nline", "rtl\u202eevil", "tab\there", "a/b", "", "x" * 300,
                                         "del\x7f"])
    def test_bad_node_id_refused(self, node_id: str) -> None:
        """Node ids with control, format or whitespace characters, '/', empty or too long are refused by field."""
        with pytest.raises(ValidationError) as e:
            validate_register(_register(node_id))
        assert e.value.field == "register.inventory.node_id"

    def test_huge_gpu_count_refused(self) -> None:
        """More GPUs than the bound is refused naming the field; the bound itself is accepted."""
        validate_register(_register("n1", MAX_GPUS))
        with pytest.raises(ValidationError) as e:
            validate_register(_register("n1", MAX_GPUS + 1))
        assert e.value.field == "register.inventory.gpus"

    def test_good_node_id_accepted(self) -> None:
        """An ordinary host name passes."""
        validate_register(_register("gpu-node-01.example"))


def _topology_register() -> agent_pb2.Register:
    """Four GPUs, two NVLink pairs on two sockets."""
    reg = _register("n1", 4)
    for g in reg.inventory.gpus:
        g.numa_node_plus_one = 1 + g.index // 2
        g.cpu_affinity.extend([g.index // 2])
        for peer in range(4):
            if peer != g.index:
                level = 1 if peer // 2 == g.index // 2 else 4
                g.links.add(peer_index=peer, level=level, nvlinks=4 if level == 1 else 0)
    return reg


class TestValidateTopology:
    """Topology fields are bounded and refer to GPUs of the node."""

    def test_good_topology_accepted(self) -> None:
        """A consistent report passes."""
        validate_register(_topology_register())

    @pytest.mark.parametrize(
        ("change", "field"),
        [
            (lambda g: g.links[0].__setattr__("peer_index", 9), "register.inventory.gpus[1].links[0].peer_index"),
            (lambda g: g.links[0].__setattr__("peer_index", 1), "register.inventory.gpus[1].links[0].peer_index"),
            (lambda g: g.links[1].__setattr__("peer_index", g.links[0].peer_index),
             "register.inventory.gpus[1].links[1].peer_index"),
            (lambda g: g.links[0].__setattr__("level", 17), "register.inventory.gpus[1].links[0].level"),
            (lambda g: g.links[0].__setattr__("nvlinks", 10_000), "register.inventory.gpus[1].links[0].nvlinks"),
            (lambda g: g.links.add(peer_index=2), "register.inventory.gpus[1].links"),
            (lambda g: g.cpu_affinity.append(1 << 20), "register.inventory.gpus[1].cpu_affinity"),
            (lambda g: g.cpu_affinity.extend(range(5000)), "register.inventory.gpus[1].cpu_affinity"),
            (lambda g: g.__setattr__("numa_node_plus_one", 1 << 30), "register.inventory.gpus[1].numa_node_plus_one"),
        ],
    )
    def test_bad_topology_refused_by_field(self, change: object, field: str) -> None:
        """Each out-of-range value is refused naming its field, never crashing the check."""
        reg = _topology_register()
        change(reg.inventory.gpus[1])  # type: ignore[operator]
        with pytest.raises(ValidationError) as e:
            validate_register(reg)
        assert e.value.field == field


class TestAdvertisedAddress:
    @pytest.mark.parametrize("address", ["127.0.0.1", "::1", "gpu-01.example", "10.1.2.3"])
    def test_good_address_accepted(self, address: str) -> None:
        reg = _register("n1")
        reg.inventory.advertise_address = address
        reg.inventory.task_port_min, reg.inventory.task_port_max = 29500, 29999
        validate_register(reg)

    @pytest.mark.parametrize("address", ["a b", "x;rm", "-bad", "a" * 300, "evil\u202e", "h:1"])
    def test_bad_address_refused(self, address: str) -> None:
        reg = _register("n1")
        reg.inventory.advertise_address = address
        with pytest.raises(ValidationError) as e:
            validate_register(reg)
        assert e.value.field == "register.inventory.advertise_address"

    @pytest.mark.parametrize("ports", [(30000, 29999), (80, 90), (29500, 70000), (0, 29999)])
    def test_bad_port_range_refused(self, ports: tuple[int, int]) -> None:
        reg = _register("n1")
        reg.inventory.task_port_min, reg.inventory.task_port_max = ports
        with pytest.raises(ValidationError) as e:
            validate_register(reg)
        assert e.value.field == "register.inventory.task_port_min"
