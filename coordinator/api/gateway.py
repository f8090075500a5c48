"""The AgentGateway gRPC service: one bidirectional stream per agent.

The first message must be a Register with a usable inventory; anything else ends the
stream with INVALID_ARGUMENT (a malformed agent never crashes the coordinator). A standby
answers with a Redirect to the leader and closes. On the leader, telemetry goes to the
Resource Monitor, task-status events are applied in order and acknowledged with EventAck,
and decisions queued for the node are written back on the same stream.
"""

from __future__ import annotations

import asyncio
import functools
import math
import unicodedata
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

import grpc
from structlog.typing import FilteringBoundLogger

from common.errors import GptrmError, ValidationError
from common.logging import get_logger
from common.netaddr import address_problem, port_range_problem
from common.pb.gptrm.v1 import agent_pb2, agent_pb2_grpc
from common.topology import validate_gpu_topology
from common.types import MAX_REPORTS
from coordinator.api.agent_guard import AgentGuard
from coordinator.api.deps import GatewayDeps
from coordinator.monitor.nodes import NodeEntry, Outbox

if TYPE_CHECKING:
    from coordinator.api.auth import Security

__all__ = ["AgentGatewayService", "validate_register"]

_REGISTER_TIMEOUT_S = 10.0
STATUS_WINDOW = 64
"""Task-status events of one agent stream being applied at once at most. One task's events apply one after the
other, in order; events of different tasks overlap (each waits on its etcd write) instead of queueing behind
each other, so a busy node's starts and ends do not wait a round trip each. Acknowledgements still go out in
event order, each only once every event up to it was applied."""


def _with_decisions_behind(first: agent_pb2.CoordinatorMessage,
                           outbox: Outbox) -> tuple[list[agent_pb2.CoordinatorMessage], bool]:
    """What to send for ``first`` (a decision) to an agent that reads ``Decisions``: it and the decisions queued right
    behind it as one message (at most :data:`~common.types.MAX_REPORTS`), then the first message taken that is not a
    decision; and whether the end of the stream (None) was taken after them."""
    batch = [first.decision]
    after: list[agent_pb2.CoordinatorMessage] = []
    while len(batch) < MAX_REPORTS and not outbox.empty():
        msg = outbox.get_nowait()
        if msg is None:
            return [_decisions_message(batch, first)], True
        if msg.WhichOneof("body") != "decision":
            after.append(msg)
            break
        batch.append(msg.decision)
    return [_decisions_message(batch, first), *after], False


def _decisions_message(batch: list[agent_pb2.Decision],
                       first: agent_pb2.CoordinatorMessage) -> agent_pb2.CoordinatorMessage:
    return first if len(batch) == 1 else agent_pb2.CoordinatorMessage(decisions=agent_pb2.Decisions(decisions=batch))


def _folded(events: Sequence[agent_pb2.TaskStatus],
            folds: Callable[[agent_pb2.TaskStatus, agent_pb2.TaskStatus], bool]) -> list[agent_pb2.TaskStatus]:
    """A report's events, less each one that ``folds`` into the same task's next event in the report (a start whose
    running came with it: applied as one write). The next event's acknowledgement covers the one left out."""
    nxt: dict[int, int] = {}   # index → index of the same task's next event
    last: dict[str, int] = {}
    for i, event in enumerate(events):
        if event.task_id in last:
            nxt[last[event.task_id]] = i
        last[event.task_id] = i
    return [e for i, e in enumerate(events) if i not in nxt or not folds(e, events[nxt[i]])]


def _hold_after_loss_s(lease_ttl_s: float) -> float:
    """How long a standby holds an agent that just lost its leader: long enough for the lease to
    expire and a successor to take over, short of the agent's 10 s wait for its first answer."""
    return min(2 * lease_ttl_s + 3.0, 8.0)


MAX_GPUS = 256
"""GPUs one node may register (the simulated agent's limit; real servers hold at most 16). The
leader's telemetry history of one node is bounded in bytes whatever the count
(:data:`coordinator.monitor.resources.NODE_HISTORY_BYTES`)."""
MAX_NODE_ID = 253


def _bad_char(c: str) -> bool:
    # Whitespace, '/', control characters and format characters (bidi overrides such as U+202E).
    return c.isspace() or c == "/" or unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn")


def validate_register(reg: agent_pb2.Register) -> None:
    """Refuse an unusable inventory before anything is recorded (no phantom node).

    :raises ValidationError: naming the inventory field that is unusable.
    """
    inv = reg.inventory
    if not inv.node_id or len(inv.node_id) > MAX_NODE_ID or any(_bad_char(c) for c in inv.node_id):
        raise ValidationError("register.inventory.node_id",
                              f"invalid node id {inv.node_id[:80]!r} (1..{MAX_NODE_ID} characters, no whitespace, "
                              "'/', control or format characters)")
    if len(inv.gpus) > MAX_GPUS:
        raise ValidationError("register.inventory.gpus", f"{len(inv.gpus)} GPUs is more than {MAX_GPUS}")
    seen = set()
    for i, g in enumerate(inv.gpus):
        if g.index in seen:
            raise ValidationError(f"register.inventory.gpus[{i}].index", f"duplicate GPU index {g.index}")
        seen.add(g.index)
        if g.index >= len(inv.gpus):
            raise ValidationError(f"register.inventory.gpus[{i}].index", f"index {g.index} out of range")
        if not math.isfinite(g.power_limit_w) or g.power_limit_w < 0:
            raise ValidationError(f"register.inventory.gpus[{i}].power_limit_w", f"invalid {g.power_limit_w}")
    validate_gpu_topology(inv.gpus, "register.inventory.gpus")
    if inv.advertise_address and (problem := address_problem(inv.advertise_address)):
        raise ValidationError("register.inventory.advertise_address", problem)
    if (inv.task_port_min or inv.task_port_max) and (
            problem := port_range_problem(inv.task_port_min, inv.task_port_max)):
        raise ValidationError("register.inventory.task_port_min", problem)


class AgentGatewayService(agent_pb2_grpc.AgentGatewayServicer):
    """Agent streams of one replica.

    :param app: the replica's components (the ``App`` from ``coordinator.app.build``).
    :param security: the server's ``Security`` (node certificates, audit); None checks no certificates.
    """

    def __init__(self, app: GatewayDeps, security: Security | None = None) -> None:
        self._app = app
        self.guard = AgentGuard(app.registry, app.tasks, security)
        self._log = get_logger("gateway")

    async def Connect(self, request_iterator: AsyncIterator[agent_pb2.AgentMessage],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[agent_pb2.CoordinatorMessage]:
        app = self._app
        try:
            first = await asyncio.wait_for(anext(request_iterator), timeout=_REGISTER_TIMEOUT_S)
        except (TimeoutError, StopAsyncIteration):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected a register message first")
        if first.WhichOneof("body") != "register":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be register")
        try:
            validate_register(first.register)
        except ValidationError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        await self.guard.admit(first.register, context)
        if not app.leadership.leading:
            redirect = await app.leadership.hold_after_loss(first.register.lost_leader_epoch,
                                                            _hold_after_loss_s(app.cfg.lease_ttl_s))
            if redirect is not None:
                yield redirect
                return
            await self.guard.admit(first.register, context)   # leading now: checked against the leader's table
        outbox = Outbox()
        entry = await app.nodes.connected(first.register, outbox)
        stream_id = entry.stream_id
        yield agent_pb2.CoordinatorMessage(welcome=agent_pb2.Welcome(
            node_id=entry.node_id, sampling_interval_s=app.cfg.sampling_interval_s, leader_epoch=app.leadership.epoch,
            coordinator_id=app.cfg.replica_id, heartbeat_interval_s=app.cfg.heartbeat_interval_s,
            report_interval_s=app.telemetry_rate.report_interval_s,   # the telemetry rate in force
            accepts_reports=True))
        reader = asyncio.create_task(self._read(entry, request_iterator, outbox))
        batched = first.register.reads_decisions
        try:
            while True:
                msg = await outbox.get()
                if msg is None:
                    break
                sends, ended = _with_decisions_behind(msg, outbox) \
                    if batched and msg.WhichOneof("body") == "decision" else ([msg], False)
                for out in sends:
                    yield out
                if ended:
                    break
        finally:
            reader.cancel()
            app.logs.stream_ended(entry.node_id, outbox)
            app.sessions.stream_ended(entry.node_id, outbox)
            app.nodes.disconnected(entry, stream_id)

    async def _read(self, entry: NodeEntry, requests: AsyncIterator[agent_pb2.AgentMessage],
                    outbox: asyncio.Queue) -> None:
        app = self._app
        log = self._log.bind(node_id=entry.node_id)
        chains: dict[str, asyncio.Task[None]] = {}   # task id → the application of its last event
        applied: asyncio.Queue[tuple[int, asyncio.Task[None]]] = asyncio.Queue(maxsize=STATUS_WINDOW)
        acker = asyncio.create_task(self._ack_in_order(applied, outbox, log))

        def end_stream_if_failed(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                outbox.put_nowait(None)

        acker.add_done_callback(end_stream_if_failed)

        def forget_chain(t: asyncio.Task[None], task_id: str) -> None:
            if chains.get(task_id) is t:
                del chains[task_id]

        async def status(event: agent_pb2.TaskStatus) -> None:
            task = asyncio.create_task(self._apply_after(chains.get(event.task_id), entry, event, log))
            chains[event.task_id] = task
            task.add_done_callback(functools.partial(forget_chain, task_id=event.task_id))
            await applied.put((event.event_seq, task))   # waits while the window is full

        async def decision_ack(ack: agent_pb2.DecisionAck) -> None:
            if self.guard.ack_allowed(entry, ack):
                if (before := chains.get(ack.task_id)) is not None and not ack.ok:
                    await asyncio.wait([before])   # a refusal is judged after the task's earlier events
                await app.reconciler.on_decision_ack(entry, ack)

        try:
            async for msg in requests:
                which = msg.WhichOneof("body")
                if which == "telemetry":
                    app.nodes.telemetry(entry, msg.telemetry)
                elif which == "heartbeat":
                    app.registry.heartbeat(entry)
                elif which == "task_status":
                    app.registry.heartbeat(entry)
                    await status(msg.task_status)
                elif which == "reports":
                    app.registry.heartbeat(entry)
                    reports = msg.reports
                    if len(reports.decision_acks) + len(reports.statuses) > MAX_REPORTS:
                        log.warning("agent_stream_ended", reason=f"reports: {len(reports.decision_acks)} acks and "
                                    f"{len(reports.statuses)} events in one message (at most {MAX_REPORTS})")
                        break
                    for one in reports.decision_acks:
                        await decision_ack(one)
                    for event in _folded(reports.statuses, app.reconciler.folds):
                        await status(event)
                elif which == "log_chunk":
                    app.logs.deliver(entry.node_id, msg.log_chunk)
                elif which == "images":
                    app.nodes.images_held(entry, msg.images)
                elif which == "session_chunk":
                    app.sessions.deliver(entry.node_id, msg.session_chunk)
                elif which == "decision_ack":
                    app.registry.heartbeat(entry)
                    await decision_ack(msg.decision_ack)
                else:
                    log.warning("agent_message_ignored", reason=f"unexpected {which}")
                if acker.done():
                    break   # an event was not applied: the stream ends (see _ack_in_order)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception as e:  # a bad message must end this stream, not the process
            log.error("agent_stream_failed", reason=repr(e))
        finally:
            acker.cancel()
            outbox.put_nowait(None)

    async def _apply_after(self, before: asyncio.Task[None] | None, entry: NodeEntry, status: agent_pb2.TaskStatus,
                           log: FilteringBoundLogger) -> None:
        """Apply one task-status event once the same task's previous event is applied (failing if it failed)."""
        if before is not None:
            await before
        if self.guard.status_allowed(entry, status):
            try:
                await self._app.reconciler.on_task_status(entry, status)
            except GptrmError as e:
                log.warning("task_status_not_applied", task_id=status.task_id, reason=str(e))
                raise

    @staticmethod
    async def _ack_in_order(applied: asyncio.Queue[tuple[int, asyncio.Task[None]]], outbox: asyncio.Queue,
                            log: FilteringBoundLogger) -> None:
        """Acknowledge events in their order, each once it and every event before it were applied.

        Acks are cumulative: at the first event that was not applied (e.g. etcd down) nothing more is
        acknowledged and the stream ends; the agent reconnects and re-sends every unacknowledged event in order
        (one applied meanwhile is applied again, which changes nothing). Events applied together (a batch of
        transitions stored in one transaction) are acknowledged by one message, up to the last of them."""
        held: tuple[int, asyncio.Task[None]] | None = None   # the next event, taken out of the queue not yet applied
        while True:
            seq, task = held if held is not None else await applied.get()
            held = None
            try:
                await task
            except Exception as e:
                log.warning("agent_stream_ended", reason=f"task status {seq} not applied: {e}")
                raise
            while not applied.empty():
                held = applied.get_nowait()
                if not held[1].done() or held[1].cancelled() or held[1].exception() is not None:
                    break   # acknowledged (or the stream ended) once it is settled
                seq, held = held[0], None
            outbox.put_nowait(agent_pb2.CoordinatorMessage(event_ack=agent_pb2.EventAck(up_to_seq=seq)))
