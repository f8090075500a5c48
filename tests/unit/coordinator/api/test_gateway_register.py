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
