"""Distributed launch: what each part of a task is told about the others, and its rendezvous port.

Part ``i`` of a task runs on ``allocation.nodes[i]`` (its rank). Every part, single-node tasks
included, gets the same view: the node count, its rank, its GPUs and the task's, rank 0's
data-plane address, and the addresses and node ids of all parts in rank order; a multi-node task
also gets the port reserved on rank 0 for it (``Allocation.master_port``; a single-node task gets
none). The agent turns these StartTask fields into the task's environment (``NNODES``,
``NODE_RANK``, ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``GPTRM_NODELIST``, ``GPTRM_NODE_IDS``), and rank 0's agent listens on the port for the task from
the start (``GPTRM_MASTER_LISTEN_FD``, ``docs/ports.md``).

The master port comes from rank 0's node's advertised range (``--task-port-range``); a port held by
another task whose rank 0 is on that node (any task placed and not ended) is never handed out again
until that task ends, nor for :data:`REFUSED_PORT_S` a port a start found held by something else. Rank 0
is a node whose agent reports a free port of its range. The port is stored in the allocation, so a new
leader sees it too.

Example::

    book = PortBook.of(tasks.values())
    port = book.take("n1", 29500, 29999)        # lowest free port of the range; 0 when all are taken
    fields = start_fields(task, rank=1)         # StartTask keyword arguments for part 1
    argv = launch_argv(task.spec, fields)       # the argv, wrapped by the spec's launcher
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from common.pb.gptrm.v1 import types_pb2
from common.types import TERMINAL_STATES, TaskState
from coordinator.profiler.qos_spec import DEFAULT_CHECKPOINT_SIGNAL, parse_signal

__all__ = ["DEFAULT_STOP_GRACE_S", "DEFAULT_TASK_PORTS", "LAUNCHERS", "REFUSED_PORT_S", "TORCHRUN_SHUTDOWN_ENV",
           "TORCHRUN_SIGNALS_ENV", "PortBook", "launch_argv", "launcher_env", "node_address", "restart_env",
           "start_fields"]

REFUSED_PORT_S = 300.0
"""How long a master port that a start found held by something else on its node is not handed out there."""
DEFAULT_TASK_PORTS = (29500, 29999)
"""The range used for a node whose agent advertises none (an older agent)."""
LAUNCHERS = ("", "torchrun")
"""Values of ``TaskSpec.launcher``: "" runs the argv as given."""


def node_address(inventory: types_pb2.NodeInventory) -> str:
    """The address other nodes reach this one at: its advertised address, else its hostname."""
    return inventory.advertise_address or inventory.hostname or inventory.node_id


def _holds_port(task: types_pb2.Task) -> bool:
    return task.state not in TERMINAL_STATES and task.state != TaskState.PENDING and bool(task.allocation.nodes)


class PortBook:
    """Master ports in use per rank-0 node, and the ones handed out since (within one scheduling cycle)."""

    def __init__(self, used: dict[str, set[int]] | None = None) -> None:
        self._used: dict[str, set[int]] = used or {}
        self._taken: dict[str, int] = {}

    @classmethod
    def of(cls, tasks: Iterable[types_pb2.Task], refused: Mapping[str, Iterable[int]] | None = None) -> PortBook:
        """The ports held by tasks that are placed and not ended, by their rank-0 node.

        :param refused: per node, ports a start recently found held by something else (not handed out).
        """
        used: dict[str, set[int]] = {node: set(ports) for node, ports in (refused or {}).items()}
        for t in tasks:
            if _holds_port(t) and t.allocation.master_port:
                used.setdefault(t.allocation.nodes[0].node_id, set()).add(t.allocation.master_port)
        return cls(used)

    def taken_here(self, node_id: str) -> int:
        """How many ports of the node :meth:`take` handed out so far (its agent's last report predates them)."""
        return self._taken.get(node_id, 0)

    def used(self, node_id: str) -> frozenset[int]:
        """The ports held on a node."""
        return frozenset(self._used.get(node_id, ()))

    def take(self, node_id: str, low: int, high: int) -> int:
        """Reserve the lowest free port of ``low..high`` on a node; 0 when none is free (or the range is empty)."""
        if not low or not high:
            low, high = DEFAULT_TASK_PORTS
        held = self._used.setdefault(node_id, set())
        for port in range(max(1, low), min(65535, high) + 1):
            if port not in held:
                held.add(port)
                self._taken[node_id] = self._taken.get(node_id, 0) + 1
                return port
        return 0


def start_fields(task: types_pb2.Task, rank: int) -> dict[str, Any]:
    """The distributed-launch fields of part ``rank``'s StartTask (see the module docstring)."""
    nodes = task.allocation.nodes
    na = nodes[rank]
    addresses = [n.address or n.node_id for n in nodes]
    return {"nnodes": len(nodes), "node_rank": rank, "local_world_size": len(na.gpu_indices),
            "world_size": sum(len(n.gpu_indices) for n in nodes), "master_addr": addresses[0],
            "master_port": task.allocation.master_port, "node_addresses": addresses,
            "node_ids": [n.node_id for n in nodes]}


def restart_env(task: types_pb2.Task) -> dict[str, str]:
    """The task's environment: its spec's, what its launcher needs (:func:`launcher_env`), plus how often it was
    started before (``GPTRM_RESTART_COUNT``: restarts after a failure, preemptions and resizes) and, for an elastic
    task, why it was last resized (``GPTRM_RESIZE_REASON``, "" when never)."""
    env = {**launcher_env(task.spec), **task.spec.env}
    env["GPTRM_RESTART_COUNT"] = str(task.restarts + task.preemptions + task.elastic.resizes)
    if task.spec.HasField("elastic"):
        env["GPTRM_RESIZE_REASON"] = task.elastic.resize_reason
    return env


DEFAULT_STOP_GRACE_S = 10.0
"""A task's stop grace when its spec gives none: how long a stopped part has after each signal."""
TORCHRUN_SIGNALS_ENV = "PET_SIGNALS_TO_HANDLE"
"""torchrun's ``--signals-to-handle`` (read from this variable when the flag is not given): the signals it passes
on to its ranks."""
TORCHRUN_SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
"""How many seconds torchrun waits for its ranks to exit after passing a signal on (then it kills them)."""
_TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""torchrun's own list, kept."""


def launcher_env(spec: types_pb2.TaskSpec) -> dict[str, str]:
    """What the spec's launcher is told through the environment (the spec's own ``env`` wins over each).

    torchrun starts each rank in a session of its own, so a signal the agent sends to the task's process group
    reaches torchrun only. It passes on to its ranks the signals of its list and dies of any other; its list lacks
    the task's checkpoint signal (``SIGUSR1`` unless the spec names another), so a preemption or a resize would end
    torchrun, and with it the ranks, before any rank could checkpoint. The list is therefore torchrun's own plus the
    checkpoint signal, and torchrun waits for its ranks as long as the agent does after each signal (the task's
    stop grace; torchrun's own wait is 30 s).
    """
    if spec.launcher != "torchrun":
        return {}
    checkpoint = parse_signal(spec.checkpoint_signal or DEFAULT_CHECKPOINT_SIGNAL).name
    names = _TORCHRUN_SIGNALS + (() if checkpoint in _TORCHRUN_SIGNALS else (checkpoint,))
    return {TORCHRUN_SIGNALS_ENV: ",".join(names),
            TORCHRUN_SHUTDOWN_ENV: str(math.ceil(spec.stop_grace_s or DEFAULT_STOP_GRACE_S))}


def launch_argv(spec: types_pb2.TaskSpec, fields: dict[str, Any]) -> list[str]:
    """The argv a part runs: the spec's, under ``torchrun`` with this part's values when the spec asks for it.

    A multi-node task's parts meet at rank 0's address and reserved port. A single-node task has no reserved
    port (its ranks never leave the node): torchrun runs it ``--standalone``, its rendezvous on a free port of
    loopback that it picks itself, so two such tasks on one node never meet (a fixed port would be shared by
    every one of them, and port 0 would be handed to the ranks as the port to reach).
    """
    argv = list(spec.argv)
    if spec.launcher != "torchrun":
        return argv
    nproc = ["--nproc-per-node", str(max(1, fields["local_world_size"]))]
    if fields["nnodes"] <= 1:
        return ["torchrun", "--standalone", "--nnodes", "1", *nproc, "--", *argv]
    return ["torchrun", "--nnodes", str(fields["nnodes"]), "--node-rank", str(fields["node_rank"]), *nproc,
            "--master-addr", fields["master_addr"], "--master-port", str(fields["master_port"]), "--", *argv]
