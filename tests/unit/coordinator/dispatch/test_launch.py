"""Distributed launch: each part's StartTask fields and environment, the torchrun argv, master ports."""

from __future__ import annotations

import asyncio
import socket

import pytest

from agent.runtime import MASTER_LISTEN_FD, MasterPortTaken, check_master_port, launch_env, master_listen_handoff
from agent.task_user import NoRoom
from common.errors import GptrmError
from common.pb.gptrm.v1 import agent_pb2, types_pb2
from common.types import TaskState
from coordinator.dispatch import Dispatcher
from coordinator.dispatch.launch import (
    DEFAULT_TASK_PORTS,
    TORCHRUN_SHUTDOWN_ENV,
    TORCHRUN_SIGNALS_ENV,
    PortBook,
    launch_argv,
    node_address,
    restart_env,
    start_fields,
)
from coordinator.monitor.nodes import NodeRegistry
from tests.helpers.ports import free_port


def gang(launcher: str = "", port: int = 29500) -> types_pb2.Task:
    """A 2-node task: 4 GPUs on n1 (rank 0, 10.0.0.1), 2 on n2 (rank 1, 10.0.0.2)."""
    task = types_pb2.Task(id="t1", spec=types_pb2.TaskSpec(argv=["train.py", "--lr", "1"], launcher=launcher),
                          state=int(TaskState.SCHEDULED))
    task.allocation.decision_id = "d1"
    task.allocation.master_port = port
    task.allocation.nodes.add(node_id="n1", gpu_indices=[0, 1, 2, 3], gpu_uuids=["a", "b", "c", "d"],
                              address="10.0.0.1")
    task.allocation.nodes.add(node_id="n2", gpu_indices=[4, 5], gpu_uuids=["e", "f"], address="10.0.0.2")
    return task


class TestStartFields:
    def test_every_part_knows_its_rank_and_peers(self) -> None:
        """Rank i is nodes[i]; both parts share the world, rank 0's address and the port."""
        task = gang()
        r0, r1 = start_fields(task, 0), start_fields(task, 1)
        assert (r0["node_rank"], r1["node_rank"]) == (0, 1)
        assert (r0["local_world_size"], r1["local_world_size"]) == (4, 2)
        for f in (r0, r1):
            assert f["nnodes"] == 2 and f["world_size"] == 6
            assert (f["master_addr"], f["master_port"]) == ("10.0.0.1", 29500)
            assert f["node_addresses"] == ["10.0.0.1", "10.0.0.2"] and f["node_ids"] == ["n1", "n2"]

    def test_env_of_a_part(self) -> None:
        """The agent turns the fields into the variables distributed launchers read."""
        st = agent_pb2.StartTask(task_id="t1", **start_fields(gang(), 1))
        assert launch_env(st) == {"NNODES": "2", "NODE_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "6",
                                  "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                                  "GPTRM_NODELIST": "10.0.0.1,10.0.0.2", "GPTRM_NODE_IDS": "n1,n2"}

    def test_single_node_task(self) -> None:
        """A single-node task gets the same variables with NNODES=1 and itself as master."""
        task = types_pb2.Task(id="t2", spec=types_pb2.TaskSpec(argv=["x"]))
        task.allocation.master_port = 29501
        task.allocation.nodes.add(node_id="n1", gpu_indices=[2], address="127.0.0.1")
        env = launch_env(agent_pb2.StartTask(task_id="t2", **start_fields(task, 0)))
        assert env["NNODES"] == "1" and env["NODE_RANK"] == "0" and env["WORLD_SIZE"] == "1"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["GPTRM_NODE_IDS"]) == ("127.0.0.1", "29501", "n1")

    def test_no_fields_from_an_older_coordinator(self) -> None:
        """A StartTask without nnodes adds nothing; without a port, no MASTER_PORT."""
        assert launch_env(agent_pb2.StartTask(task_id="t1")) == {}
        assert "MASTER_PORT" not in launch_env(agent_pb2.StartTask(task_id="t1", **start_fields(gang(port=0), 0)))

    def test_address_falls_back_to_hostname(self) -> None:
        assert node_address(types_pb2.NodeInventory(node_id="n1", hostname="h1")) == "h1"
        assert node_address(types_pb2.NodeInventory(node_id="n1", hostname="h1", advertise_address="10.1.1.1")) \
            == "10.1.1.1"


class TestLauncher:
    def test_torchrun_wraps_the_argv_with_the_part_values(self) -> None:
        task = gang("torchrun")
        assert launch_argv(task.spec, start_fields(task, 1)) == [
            "torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "10.0.0.1",
            "--master-port", "29500", "--", "train.py", "--lr", "1"]

    def test_torchrun_runs_a_single_node_task_standalone(self) -> None:
        """A single-node task has no reserved port: torchrun picks its own rendezvous port (``--standalone``) rather
        than being told port 0, which it would hand its ranks as the port to reach."""
        task = types_pb2.Task(id="t2", spec=types_pb2.TaskSpec(argv=["train.py"], launcher="torchrun"))
        task.allocation.nodes.add(node_id="n1", gpu_indices=[0, 1], address="10.0.0.1")
        assert launch_argv(task.spec, start_fields(task, 0)) == [
            "torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--", "train.py"]

    def test_torchrun_passes_the_checkpoint_signal_on_to_its_ranks(self) -> None:
        """torchrun's ranks run in sessions of their own: its list of signals to pass on gets the task's checkpoint
        signal (the default, or the spec's) beside its own, and it waits for its ranks as long as the task's stop
        grace; what the spec's env sets is kept; no launcher, neither."""
        def env(**spec: object) -> dict[str, str]:
            return restart_env(types_pb2.Task(id="t1", spec=types_pb2.TaskSpec(argv=["train.py"], **spec)))

        own = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
        got = env(launcher="torchrun")
        assert (got[TORCHRUN_SIGNALS_ENV], got[TORCHRUN_SHUTDOWN_ENV]) == (own + ",SIGUSR1", "10")
        got = env(launcher="torchrun", checkpoint_signal="usr2", stop_grace_s=45.5)
        assert (got[TORCHRUN_SIGNALS_ENV], got[TORCHRUN_SHUTDOWN_ENV]) == (own + ",SIGUSR2", "46")
        assert env(launcher="torchrun", checkpoint_signal="SIGTERM")[TORCHRUN_SIGNALS_ENV] == own
        assert env(launcher="torchrun", env={TORCHRUN_SIGNALS_ENV: "SIGTERM"})[TORCHRUN_SIGNALS_ENV] == "SIGTERM"
        assert not {TORCHRUN_SIGNALS_ENV, TORCHRUN_SHUTDOWN_ENV} & set(env())

    def test_no_launcher_keeps_the_argv(self) -> None:
        task = gang()
        assert launch_argv(task.spec, start_fields(task, 0)) == ["train.py", "--lr", "1"]

    def test_dispatcher_sends_each_node_its_part(self) -> None:
        """StartTask for n2 carries rank 1 and the torchrun argv."""
        registry = NodeRegistry(1.0, 5.0)
        outboxes: dict[str, asyncio.Queue] = {}
        for n in ("n1", "n2"):
            outboxes[n] = asyncio.Queue()
            registry.connect(types_pb2.NodeInventory(node_id=n), outbox=outboxes[n])
        Dispatcher(registry, epoch=lambda: 1).start(gang("torchrun"))
        st = outboxes["n2"].get_nowait().decision.start
        assert (st.node_rank, st.nnodes, st.master_port, st.master_addr) == (1, 2, 29500, "10.0.0.1")
        assert list(st.argv[:2]) == ["torchrun", "--nnodes"] and list(st.argv[-3:]) == ["train.py", "--lr", "1"]
        assert outboxes["n1"].get_nowait().decision.start.node_rank == 0


class TestPortBook:
    def test_lowest_free_port_of_the_range(self) -> None:
        book = PortBook()
        assert [book.take("n1", 30000, 30002) for _ in range(4)] == [30000, 30001, 30002, 0]
        assert book.take("n2", 30000, 30002) == 30000   # per node

    def test_an_unadvertised_range_uses_the_default(self) -> None:
        assert PortBook().take("n1", 0, 0) == DEFAULT_TASK_PORTS[0]

    def test_ports_of_placed_tasks_are_not_reused(self) -> None:
        """Ports of tasks placed and not ended on their rank-0 node are held; ended or pending ones are free."""
        running = gang(port=29500)
        running.state = int(TaskState.RUNNING)
        preempted = gang(port=29501)
        preempted.state = int(TaskState.PREEMPTED)
        ended = gang(port=29502)
        ended.state = int(TaskState.FAILED)
        book = PortBook.of([running, preempted, ended])
        assert book.used("n1") == {29500, 29501} and book.used("n2") == frozenset()
        assert book.take("n1", 29500, 29999) == 29502
        assert book.take("n2", 29500, 29999) == 29500   # n2 is rank 1 of those tasks: nothing held there


class TestMasterPortCheck:
    def test_rank0_refuses_a_port_in_use(self) -> None:
        """Rank 0's agent refuses a start whose master port another process listens on, naming it, as a start
        refused for want of room (placed again, not failed)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            st = agent_pb2.StartTask(task_id="t1", nnodes=2, node_rank=0, master_port=port)
            with pytest.raises(MasterPortTaken, match=f"master port {port}"):
                check_master_port(st)
            assert issubclass(MasterPortTaken, NoRoom) and issubclass(MasterPortTaken, GptrmError)
            st.node_rank = 1
            assert check_master_port(st) is None   # only rank 0 holds it

    def test_a_single_node_task_reserves_nothing(self) -> None:
        """A task outside a gang gets no port and no bind check, even when it names a port in use."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            assert check_master_port(agent_pb2.StartTask(task_id="t1", nnodes=1, node_rank=0,
                                                         master_port=port)) is None

    def test_rank0_holds_the_port_until_the_task_has_it(self) -> None:
        """The reservation listens on the port: nothing else can bind it meanwhile, even with SO_REUSEADDR and
        SO_REUSEPORT; the handoff names the fd the task inherits."""
        port = free_port()
        listener = check_master_port(agent_pb2.StartTask(task_id="t1", nnodes=2, node_rank=0, master_port=port))
        assert listener is not None
        try:
            for host in ("127.0.0.1", "0.0.0.0"):
                with socket.socket() as other:
                    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                    with pytest.raises(OSError):
                        other.bind((host, port))
            fds, env = master_listen_handoff(listener)
            assert fds == (listener.fileno(),) and env == {MASTER_LISTEN_FD: str(listener.fileno())}
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                conn, _ = listener.accept()   # the task accepts on it as it is
                conn.close()
        finally:
            listener.close()
        assert master_listen_handoff(None) == ((), {})


class TestAgentFlags:
    def test_defaults_and_given_values(self) -> None:
        from agent.config import load

        assert load(["--insecure"]).task_port_range == "29500-29999"
        cfg = load(["--insecure", "--advertise-address", "127.0.0.1", "--task-port-range", "40000-40010"])
        assert (cfg.advertise_address, cfg.task_port_range) == ("127.0.0.1", "40000-40010")

    @pytest.mark.parametrize("flags", [["--task-port-range", "29999-29500"], ["--task-port-range", "80-90"],
                                       ["--task-port-range", "x"], ["--advertise-address", "a b"]])
    def test_bad_values_refused(self, flags: list[str]) -> None:
        from agent.config import load
        from common.errors import ConfigError

        with pytest.raises(ConfigError):
            load(["--insecure", *flags])
