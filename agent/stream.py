"""The agent's one bidirectional stream to the coordinator.

On every connection the agent registers (inventory + full task table), waits for the
coordinator's Welcome, re-sends every unacknowledged task-status event and the buffered
telemetry oldest first, then keeps sending telemetry (and a heartbeat whenever nothing went
out for a heartbeat interval) while it carries out decisions. The coordinator's report interval
(Welcome, then TelemetryRate) goes to the outbox, which then queues one summary per interval; the
heartbeat follows it (a heartbeat after max(heartbeat interval, report interval + one sampling
interval) of silence, the extra sampling interval so a summary a little late is not doubled), so
a node reporting every 10 s sends nothing in between and the coordinator's liveness window widens
to match. A standby answers with a
Redirect, which is followed at once; any other failure tries the next configured address
after an exponential backoff with full jitter.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias, cast

import grpc
import grpc.aio
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from agent.logstore import LogService
from agent.outbox import Outbox
from agent.sessions import SessionService
from common.logging import get_logger
from common.pb.gptrm.v1 import agent_pb2, agent_pb2_grpc
from common.types import MAX_REPORTS

__all__ = ["AgentStream", "Backoff"]

_Call: TypeAlias = "grpc.aio.StreamStreamCall[agent_pb2.AgentMessage, agent_pb2.CoordinatorMessage]"

DecisionHandler = Callable[[agent_pb2.Decision], Awaitable[agent_pb2.DecisionAck]]
"""Carries out one decision and returns its acknowledgement."""

TaskTable = Callable[[], list[agent_pb2.TaskStatus]]
"""Returns the status of every task the agent runs (sent with Register)."""


class Backoff:
    """Exponential backoff with full jitter: delay n is uniform in [0, min(max, initial·2ⁿ)].

    :param rng: injected for deterministic tests.
    """

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        cap = min(self.max_s, self.initial_s * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        return self._rng.uniform(cap / 2, cap)

    def reset(self) -> None:
        self.attempt = 0


_MAX_REDIRECTS_IN_ROW = 2


class _Redirected(Exception):
    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address


class AgentStream:
    """Keeps the agent connected and its outbox flowing.

    :param addresses: coordinator ``HOST:PORT`` list, tried in turn.
    :param register: builds the Register message (inventory + task table) at each connect.
    :param outbox: buffered telemetry and status events.
    :param on_decision: handler for decisions pushed by the coordinator.
    :param batch_samples: most samples per telemetry message.
    :param logs: answers the coordinator's log requests (None: they are ignored).
    :param images: the references the node's image store holds now (sent when they change; None: never).
    :param credentials: returns the TLS channel credentials for each new connection (so a SIGHUP
        reload applies at the next reconnect); None connects in plaintext (``--insecure``).
    """

    def __init__(self, addresses: Sequence[str], register: Callable[[], agent_pb2.Register], outbox: Outbox,
                 on_decision: DecisionHandler, backoff: Backoff, batch_samples: int = 1,
                 credentials: Callable[[], grpc.ChannelCredentials] | None = None,
                 logs: LogService | None = None, redirect_jitter_s: float = 0.0,
                 images: Callable[[], list[str]] | None = None, sessions: SessionService | None = None) -> None:
        self.addresses = list(addresses)
        self._redirect_jitter_s = redirect_jitter_s
        self._credentials = credentials
        self._register = register
        self.outbox = outbox
        self._on_decision = on_decision
        self._backoff = backoff
        self._batch = max(1, batch_samples)
        self._wakeup = outbox.wakeup
        self._acks: collections.deque[agent_pb2.DecisionAck] = collections.deque()
        self._logs = logs
        self._images = images
        self._sessions = sessions
        # Log chunks wait here for the writer; a full queue makes the log readers wait (never grows).
        self._log_chunks: asyncio.Queue[agent_pb2.LogChunk] = asyncio.Queue(maxsize=32)
        # Session output waits here the same way (each session also keeps to its window, agent.sessions).
        self._session_chunks: asyncio.Queue[agent_pb2.SessionChunk] = asyncio.Queue(maxsize=64)
        self._log = get_logger("agent").bind(component="agent_stream")
        self.connected = asyncio.Event()
        self.welcome: agent_pb2.Welcome | None = None
        self.connects_total = 0
        self._next = 0
        # Epoch of the leader whose session broke, until the next welcome (``Register.lost_leader_epoch``).
        self._lost_epoch = 0
        self._images_sent: list[str] = []

    def kick(self) -> None:
        """Something was added to the outbox: send it now."""
        self._wakeup.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, stream, reconnect until ``stop`` is set."""
        redirect: str | None = None
        redirects = 0   # redirects in a row without a session
        while not stop.is_set():
            address = redirect or self.addresses[self._next % len(self.addresses)]
            redirect = None
            connects = self.connects_total
            try:
                await self._session(address, stop)
            except _Redirected as r:
                self._log.info("redirected_to_leader", address=address, leader_address=r.address)
                redirects = 0 if self.connects_total != connects else redirects + 1
                # Followed at once, but not in a loop: during a leader change a standby may name the
                # dead leader, whose restarted address redirects back; then back off and rotate.
                if r.address and redirects <= _MAX_REDIRECTS_IN_ROW:
                    redirect = r.address
                    # A leader change sends the whole fleet to one coordinator: arrive spread out, not at once.
                    if self._redirect_jitter_s > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), timeout=random.uniform(0, self._redirect_jitter_s))
                    continue
                redirects = 0
            except (TimeoutError, grpc.aio.AioRpcError, ConnectionError) as e:
                code = e.code().name if isinstance(e, grpc.aio.AioRpcError) else type(e).__name__
                self._log.warning("stream_failed", address=address, reason=code, attempt=self._backoff.attempt)
            except Exception as e:  # the daemon loop is a boundary: log, back off, reconnect
                self._log.error("stream_failed", address=address, reason=repr(e), attempt=self._backoff.attempt,
                                exc_info=True)
            finally:
                self.connected.clear()
            if self.connects_total != connects and self.welcome is not None:
                # A welcomed session broke (or its leader stepped down naming no successor): the next
                # standby asked holds this agent until a new leader is known rather than send it back.
                self._lost_epoch = self.welcome.leader_epoch
            if stop.is_set():
                break
            self._next += 1
            delay = self._backoff.next_delay()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _session(self, address: str, stop: asyncio.Event) -> None:
        channel = (grpc.aio.secure_channel(address, self._credentials()) if self._credentials is not None
                   else grpc.aio.insecure_channel(address))
        async with channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            register = self._register()
            register.lost_leader_epoch = self._lost_epoch
            register.reads_decisions = True
            if self._images is not None:
                del register.inventory.images[:]
                register.inventory.images.extend(self._images())
            self._images_sent = list(register.inventory.images)
            await call.write(agent_pb2.AgentMessage(register=register))
            first = await asyncio.wait_for(call.read(), timeout=10)
            if first is grpc.aio.EOF:
                raise ConnectionError("stream closed before welcome")
            if first.HasField("redirect"):
                raise _Redirected(first.redirect.leader_address)
            if not first.HasField("welcome"):
                raise ConnectionError("first coordinator message was not a welcome")
            self.welcome = first.welcome
            self._lost_epoch = 0
            self.outbox.set_report_interval(first.welcome.report_interval_s)   # 0 (older coordinator): every sample
            self.connects_total += 1
            self._backoff.reset()
            self.connected.set()
            self._log.info("stream_connected", address=address, coordinator_id=first.welcome.coordinator_id,
                           leader_epoch=first.welcome.leader_epoch)
            reader = asyncio.create_task(self._read(call))
            try:
                await self._write(call, stop, reader)
            finally:
                reader.cancel()
                call.cancel()
                if self._logs is not None:
                    self._logs.cancel_all()
                if self._sessions is not None:
                    self._sessions.cancel_all()
                while not self._log_chunks.empty():
                    self._log_chunks.get_nowait()
                while not self._session_chunks.empty():
                    self._session_chunks.get_nowait()
            if reader.done() and not reader.cancelled() and (failure := reader.exception()):
                raise failure

    async def _write(self, call: grpc.aio.StreamStreamCall, stop: asyncio.Event, reader: asyncio.Task) -> None:
        sent_seq = 0
        welcome_beat_s = (self.welcome.heartbeat_interval_s if self.welcome else 0) or 1.0
        last_beat = 0.0
        while not stop.is_set() and not reader.done():
            # Cleared before what is queued is read, so that whatever is queued during the writes below (a decision
            # acknowledged while an event was being written) wakes the next round at once instead of waiting.
            self._wakeup.clear()
            heartbeat_s = max(welcome_beat_s, self.outbox.quiet_s)
            if self.welcome is not None and self.welcome.accepts_reports:
                sent_seq = await self._write_reports(call, sent_seq)
            while self._acks:
                await call.write(agent_pb2.AgentMessage(decision_ack=self._acks.popleft()))
            while not self._log_chunks.empty():
                await call.write(agent_pb2.AgentMessage(log_chunk=self._log_chunks.get_nowait()))
            while not self._session_chunks.empty():
                await call.write(agent_pb2.AgentMessage(session_chunk=self._session_chunks.get_nowait()))
            if self._images is not None and (held := self._images()) != self._images_sent:
                await call.write(agent_pb2.AgentMessage(images=agent_pb2.ImagesHeld(refs=held)))
                self._images_sent = held
            for event in self.outbox.events_after(sent_seq):
                await call.write(agent_pb2.AgentMessage(task_status=event))
                sent_seq = event.event_seq
            while self.outbox.pending_samples:
                batch = self.outbox.take_samples(self._batch)
                try:
                    await call.write(agent_pb2.AgentMessage(telemetry=agent_pb2.TelemetryBatch(
                        samples=batch, dropped_samples_total=self.outbox.dropped_total)))
                except BaseException:
                    self.outbox.requeue_samples(batch)
                    raise
                # Telemetry proves liveness like a heartbeat does (the coordinator counts both),
                # so a node that reports every interval sends no separate heartbeat.
                last_beat = time.monotonic()
            now = time.monotonic()
            if now - last_beat >= heartbeat_s:
                await call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(time_unix_s=time.time())))
                last_beat = now
            wait = asyncio.create_task(self._wakeup.wait())
            await asyncio.wait({wait, reader}, timeout=max(0.0, heartbeat_s - (time.monotonic() - last_beat)),
                               return_when=asyncio.FIRST_COMPLETED)
            wait.cancel()

    async def _write_reports(self, call: grpc.aio.StreamStreamCall, sent_seq: int) -> int:
        """The decision acks and the events queued, several to a message (``Reports``, to a coordinator that reads
        them); a lone one goes as its own message. Returns the last event sequence sent."""
        events = self.outbox.events_after(sent_seq)
        while len(self._acks) + len(events) > 1:
            acks = [self._acks.popleft() for _ in range(min(len(self._acks), MAX_REPORTS))]
            batch, events = events[:MAX_REPORTS - len(acks)], events[MAX_REPORTS - len(acks):]
            await call.write(agent_pb2.AgentMessage(reports=agent_pb2.Reports(decision_acks=acks, statuses=batch)))
            if batch:
                sent_seq = batch[-1].event_seq
        return sent_seq

    async def _send_chunk(self, chunk: agent_pb2.LogChunk) -> None:
        await self._log_chunks.put(chunk)
        self.kick()

    async def _send_session_chunk(self, chunk: agent_pb2.SessionChunk) -> None:
        await self._session_chunks.put(chunk)
        self.kick()

    async def _read(self, call: _Call) -> None:
        while True:
            read = await call.read()
            if read is grpc.aio.EOF:
                raise ConnectionError("coordinator closed the stream")
            # The stubs type read()'s result as object (EOF's type); past EOF it is a CoordinatorMessage.
            msg = cast(agent_pb2.CoordinatorMessage, read)
            which = msg.WhichOneof("body")
            if which == "event_ack":
                self.outbox.ack(msg.event_ack.up_to_seq)
            elif which == "decision":
                # Acks go through the writer: a gRPC call takes one write at a time.
                self._acks.append(await self._on_decision(msg.decision))
                self.kick()
            elif which == "decisions":   # several queued together, carried out in order
                for decision in msg.decisions.decisions:
                    self._acks.append(await self._on_decision(decision))
                self.kick()
            elif which == "log_request" and self._logs is not None:
                self._logs.handle(msg.log_request, self._send_chunk)
            elif which == "session_request" and self._sessions is not None:
                self._sessions.handle(msg.session_request, self._send_session_chunk)
            elif which == "telemetry_rate":
                self.outbox.set_report_interval(msg.telemetry_rate.report_interval_s)
                self._log.info("telemetry_rate_changed", report_interval_s=msg.telemetry_rate.report_interval_s)
                self.kick()
            elif which == "redirect":
                raise _Redirected(msg.redirect.leader_address)
            elif which is None and msg.ByteSize():
                # A message newer than this agent: said once per message, never the end of the stream.
                self._log.warning("coordinator_message_ignored", reason="a message kind this agent does not know",
                                  fields=_unknown_fields(msg))


def _unknown_fields(msg: Message) -> list[int]:
    """The numbers of the fields of ``msg`` that this build does not know, sorted."""
    unknown = UnknownFieldSet(msg)
    return sorted({unknown[i].field_number for i in range(len(unknown))})
