"""Services: inference tasks run as MIN..MAX replica tasks, scaled ahead of their load by the leader.

A service is a record at ``services/<id>`` (``Service``: the replica template, the desired count,
whether an admin pinned it, the last decisions), written only through ``Leadership.write`` (fenced),
so a new leader reads it and continues. Each replica is an ordinary task (its own GPUs, its own
process, placed by the scheduler like any other) carrying ``service_id`` and ``replica_index``,
with the environment variables

- ``GPTRM_SERVICE``: the service id;
- ``GPTRM_REPLICA``: the replica index (0-based);
- ``GPTRM_PORT_OFFSET``: the same index, to add to any port the server binds;
- ``GPTRM_METRICS_PORT``: the service's metrics port plus the index (the replica's ``metrics_port``),

so two replicas on one node never bind the same port.

The leader's :class:`ServiceController` ticks every few seconds: it reads each service's signal
(the replicas' mean GPU utilization, their p95 latency or their tokens/s from the QoS readings),
adds the load (requests running + waiting, or the busy GPU fraction) to the service's history,
forecasts the highest load within a replica's measured decision-to-ready time, asks the
:class:`~coordinator.adaptor.autoscale.Autoscaler` for the count (``max(reactive, forecast)``,
with stabilization, cooldown and an action bound), stores a changed count, and then makes the
replica tasks match it: creates missing indices (a dead replica's index is missing, so it is
replaced), cancels extra ones highest index first.

Every few closed buckets the leader stores each running service's load history and learned per-replica
capacity at ``service-history/<id>`` (fenced); a new leader reads it once when it recovers the services
and continues the same forecast (a record that is corrupt or does not fit is logged and the service
starts with an empty history).

Agents take no part beyond running tasks: a replica is a task, so ``ScaleTask`` decisions are never
sent, and an agent refuses one if it gets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from common.errors import EtcdUnavailable, Fenced, GptrmError, IllegalTransition, NotFound, ValidationError
from common.logging import get_logger
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from common.types import TERMINAL_STATES, NodeState, TaskState
from coordinator.adaptor.autoscale import Autoscaler, ScalePolicy
from coordinator.adaptor.forecast import Forecast, HistorySnapshot, LoadHistory
from coordinator.events import EventBus
from coordinator.monitor.nodes import NodeRegistry
from coordinator.monitor.resources import ResourceMonitor
from coordinator.profiler import Profiler, gpus_used, validate_spec
from coordinator.profiler.taskspec import MAX_REPLICAS
from coordinator.profiler.validation import validate_service
from coordinator.state import LeaderState
from coordinator.supervisor import Beat, no_beat
from coordinator.sync.leadership import Leadership
from coordinator.sync.services import ServiceStore
from coordinator.tasks import TaskTable

__all__ = ["MAX_REPLICAS", "ServiceController", "ServiceMetrics", "check_stored_service", "replica_spec",
           "validate_service"]

_DECISIONS_KEPT = 20
SPREAD_WAIT_S = 30.0   # a spread replica pending this long is placed anywhere instead
_DEFAULT_LEAD_S = 60.0
_FRESH_S = 30.0
"""A replica's QoS reading older than this is not used (no reading: the count freezes)."""
_READY_WAIT_S = 300.0
"""Decisions wait for replicas still starting, at most this long (a replica that cannot be placed does not block)."""


def check_stored_service(svc: types_pb2.Service) -> None:
    """Whether a service read from etcd can be run: its spec passes :func:`validate_service` (the cluster's
    size aside, which may have changed since it was created).

    :raises ValidationError: naming the field.
    """
    validate_service(svc.spec, cluster_gpus=0, gpus_per_replica=1)


def replica_spec(service: types_pb2.Service, index: int) -> types_pb2.TaskSpec:
    """The task spec of replica ``index``: the template with its own name, environment and metrics port."""
    spec = types_pb2.TaskSpec()
    spec.CopyFrom(service.spec)
    spec.ClearField("service")
    spec.replicas = 1
    spec.name = f"{service.spec.name or service.id}-{index}"
    spec.env["GPTRM_SERVICE"] = service.id
    spec.env["GPTRM_REPLICA"] = str(index)
    spec.env["GPTRM_PORT_OFFSET"] = str(index)
    if service.spec.metrics_port:
        spec.metrics_port = service.spec.metrics_port + index
        spec.env["GPTRM_METRICS_PORT"] = str(spec.metrics_port)
    spec.labels["gptrm.service"] = service.id
    return spec


class ServiceMetrics:
    """The controller's Prometheus series, labelled by service.

    :param registry: the coordinator's collector registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.desired = Gauge("gptrm_service_replicas_desired", "replicas a service's controller keeps",
                             ["service"], registry=r)
        self.running = Gauge("gptrm_service_replicas_running", "replicas running", ["service"], registry=r)
        self.signal = Gauge("gptrm_service_signal", "the scaling signal now (utilization, p95 ms or tokens/s)",
                            ["service"], registry=r)
        self.load = Gauge("gptrm_service_load", "load now (requests running + waiting, or busy GPU fraction)",
                          ["service"], registry=r)
        self.forecast = Gauge("gptrm_service_forecast_load", "highest load forecast within the lead time",
                              ["service"], registry=r)
        self.forecast_replicas = Gauge("gptrm_service_forecast_replicas", "replicas the forecast needs",
                                       ["service"], registry=r)
        self.mape = Gauge("gptrm_service_forecast_mape_percent", "forecast error over the last day (MAPE, %)",
                          ["service"], registry=r)
        self.lead = Gauge("gptrm_service_lead_time_seconds", "measured decision-to-ready time of a replica",
                          ["service"], registry=r)
        self.actions = Counter("gptrm_service_scale_actions_total", "replica count changes",
                               ["service", "direction"], registry=r)


@dataclass
class _Runtime:
    """What the leader knows of one service beyond its record (rebuilt by a new leader)."""

    scaler: Autoscaler
    history: LoadHistory
    lead_s: float = _DEFAULT_LEAD_S
    lead_samples: int = 0
    capacity: float = 0.0                 # load one replica carries at the target (learned)
    saved_closed: int = 0                 # history.closed when the history was last stored
    created: dict[str, float] = field(default_factory=dict)   # replica task id → when it was asked for
    cancelling: set[str] = field(default_factory=set)
    unspread: set[int] = field(default_factory=set)   # replica indices to place anywhere (spreading found no room)
    frozen: bool = False
    view: types_pb2.Service = field(default_factory=types_pb2.Service)


def _observe(history: LoadHistory, now: float, load: float | None, lead_s: float) -> Forecast:
    if load is not None:
        history.add(now, load)
    return history.forecast(now, lead_s)


class ServiceController:
    """The leader's replica controller for every service.

    :param store: service records in etcd.
    :param leadership: leader check and fenced writes.
    :param state: the leader's state (the services, as etcd stored them).
    :param tasks: the task table (replicas are tasks).
    :param monitor: GPU telemetry and the tasks' QoS readings.
    :param registry: the node table (cluster size for validation).
    :param profiler: sizes a replica (GPUs per replica).
    :param events: the cluster event log (``scale`` events).
    :param metrics: the controller's series.
    :param interval_s: seconds between ticks.
    :param policy: scaling windows (MIN and MAX come from each service).
    :param history_bucket_s: seconds per load-history bucket.
    :param history_save_buckets: the load history is stored every this many closed buckets.
    :param clock: monotonic seconds; ``wall``: Unix seconds.
    """

    def __init__(self, store: ServiceStore, leadership: Leadership, state: LeaderState, tasks: TaskTable,
                 monitor: ResourceMonitor,
                 registry: NodeRegistry, profiler: Profiler, events: EventBus, metrics: ServiceMetrics, *,
                 interval_s: float = 5.0, policy: ScalePolicy | None = None,
                 history_bucket_s: float = 60.0, history_save_buckets: int = 5,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if history_save_buckets < 1:
            raise ValueError("history_save_buckets must be at least 1")
        self._store, self._leadership, self._state, self._tasks = store, leadership, state, tasks
        self._monitor, self._registry, self._profiler = monitor, registry, profiler
        self._events, self._metrics = events, metrics
        self._interval_s, self._bucket_s, self._save_every = interval_s, history_bucket_s, history_save_buckets
        self._policy = policy or ScalePolicy(min_replicas=1, max_replicas=1)
        self._clock, self._wall = clock, wall
        self._rt: dict[str, _Runtime] = {}
        self._recovered = False
        self._kick = asyncio.Event()
        self._log = get_logger("adaptor")

    @property
    def services(self) -> Mapping[str, types_pb2.Service]:
        """Every service by id (read-only; the leader state's)."""
        return self._state.services

    # ---- admin operations ---------------------------------------------------------------------

    async def create(self, spec: types_pb2.TaskSpec, request_id: str = "", *,
                     submitted_by: str = "") -> types_pb2.Service:
        """Validate and store a new service at MIN replicas (the next tick creates them), created by
        ``submitted_by`` (its replicas are submitted in that name).

        A request id makes the create idempotent: the service id is derived from it, so a client that
        retries across a leader change gets the one service it created, never a second one.

        :raises ValidationError: naming the field (also: a request id reused with a different spec).
        :raises NotLeader: on a standby.
        """
        self._leadership.require_leader()
        if len(request_id) > 128:
            raise ValidationError("request_id", f"{len(request_id)} characters; at most 128")
        service_id = "s-" + (hashlib.sha256(request_id.encode()).hexdigest() if request_id else uuid.uuid4().hex)[:10]
        if request_id:
            try:
                existing = await asyncio.to_thread(self._store.get, service_id)
            except NotFound:
                existing = None
            if existing is not None:
                if existing.spec.SerializeToString(deterministic=True) != spec.SerializeToString(deterministic=True):
                    raise ValidationError("request_id", f"{request_id!r} was used for service {service_id} "
                                                        "with a different spec")
                if existing.id not in self.services:
                    self._state.apply_service(existing)
                return existing
        if not spec.HasField("service"):
            raise ValidationError("spec.service", "is required for a service (--replicas MIN:MAX)")
        live = [e for e in self._registry if e.state != NodeState.LOST]
        max_gpus = max((len(e.inventory.gpus) for e in live), default=0)
        svc = types_pb2.Service(id=service_id, spec=spec, desired=spec.service.min_replicas,
                                submit_unix_s=self._wall(), reason="created at MIN replicas",
                                submitted_by=submitted_by[:256])
        template = replica_spec(svc, 0)
        validate_spec(template, max_gpus_per_node=max_gpus)
        gpus = max(1, gpus_used(self._profiler.profile(template).to_proto().gpus))
        validate_service(spec, cluster_gpus=sum(len(e.inventory.gpus) for e in live), gpus_per_replica=gpus)
        stored = await self._leadership.write(self._store.put, svc)
        self._state.apply_service(stored)
        self._log.info("service_created", service_id=stored.id, min=spec.service.min_replicas,
                       max=spec.service.max_replicas)
        self._events.publish("scale", f"service {stored.id} created with {stored.desired} replica(s)",
                             service_id=stored.id, to=stored.desired, reason=stored.reason)
        self._kick.set()
        return stored

    async def scale(self, service_id: str, replicas: int | None) -> types_pb2.Service:
        """Pin the count (``replicas``) or unpin it (None: autoscaling decides again).

        :raises NotFound: no such service.
        :raises ValidationError: the count is outside the service's MIN..MAX.
        """
        self._leadership.require_leader()
        svc = self._get(service_id)
        lo, hi = svc.spec.service.min_replicas, svc.spec.service.max_replicas
        if svc.stopped:
            raise IllegalTransition(f"service {service_id}: cancelled, it cannot be scaled")
        if replicas is not None and not lo <= replicas <= hi:
            raise ValidationError("replicas", f"{replicas} is outside the service's range {lo}..{hi}")
        new = types_pb2.Service()
        new.CopyFrom(svc)
        if replicas is None:
            new.pinned, new.reason = False, "unpinned by an admin: autoscaling"
        else:
            new.pinned, new.desired, new.reason = True, replicas, f"pinned at {replicas} by an admin"
        stored = await self._persist(svc, new, svc.desired)
        rt = self._runtime(stored)
        rt.scaler.note_action()
        self._kick.set()
        return stored

    async def cancel(self, service_id: str) -> types_pb2.Service:
        """Stop a service: its replicas are cancelled and none is created again (the record stays, stopped).

        :raises NotFound: no such service.
        :raises IllegalTransition: it is stopped already.
        """
        self._leadership.require_leader()
        svc = self._get(service_id)
        if svc.stopped:
            raise IllegalTransition(f"service {service_id}: already cancelled")
        new = types_pb2.Service()
        new.CopyFrom(svc)
        new.stopped, new.pinned, new.desired, new.reason = True, True, 0, "cancelled by an admin"
        stored = await self._persist(svc, new, svc.desired)
        self._kick.set()
        return stored

    async def stored_view(self, service_id: str, tasks: list[types_pb2.Task]) -> admin_pb2.ServiceView:
        """What a standby shows: the stored record and the replicas among ``tasks`` (read from etcd), without
        the leader's signal and forecast.

        :raises NotFound: no such service.
        """
        svc = await asyncio.to_thread(self._store.get, service_id)
        replicas = sorted((t for t in tasks if t.service_id == service_id and t.state not in TERMINAL_STATES),
                          key=lambda t: (t.replica_index, t.submit_unix_s))
        return admin_pb2.ServiceView(service=svc, replicas=replicas, stale=self._leadership.stale)

    def view(self, service_id: str) -> admin_pb2.ServiceView:
        """The service with the leader's current signal, forecast and error, and its live replicas."""
        svc = self._get(service_id)
        out = types_pb2.Service()
        out.CopyFrom(svc)
        rt = self._rt.get(service_id)
        if rt is not None:
            out.MergeFrom(rt.view)
        replicas = sorted(self._replicas(service_id), key=lambda t: (t.replica_index, t.submit_unix_s))
        result = admin_pb2.ServiceView(service=out, stale=self._leadership.stale)
        for t in replicas:
            task = result.replicas.add()
            task.CopyFrom(t)
            reading = self._monitor.task_qos(t.id)
            if reading is not None:
                task.qos_reading.CopyFrom(reading.to_proto())
        return result

    def load_history(self, service_id: str) -> HistorySnapshot | None:
        """The service's load per closed bucket as the leader keeps it (None: not known here, e.g. on a standby)."""
        rt = self._rt.get(service_id)
        return rt.history.snapshot() if rt is not None else None

    def _get(self, service_id: str) -> types_pb2.Service:
        svc = self.services.get(service_id)
        if svc is None:
            raise NotFound(f"service {service_id!r} not found")
        return svc

    # ---- the loop -----------------------------------------------------------------------------

    async def run(self, leading: Callable[[], bool], beat: Beat = no_beat) -> None:
        """Recover the services from etcd, then tick while this replica leads."""
        while True:
            if leading():
                try:
                    if not self._recovered:
                        self._state.adopt_services(await asyncio.to_thread(self._store.list))
                        self._recovered = True
                        self._log.info("services_recovered", services=len(self.services))
                        await self._recover_histories()
                    await self.tick()
                except Fenced:
                    return
                except GptrmError as e:   # etcd trouble: retried at the next tick
                    self._log.warning("service_tick_failed", reason=str(e))
            else:
                self._recovered = False   # leading again later: read etcd afresh
            beat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self._interval_s)
            self._kick.clear()

    def _replicas(self, service_id: str) -> list[types_pb2.Task]:
        return [t for t in self._tasks.values()
                if t.service_id == service_id and t.state not in TERMINAL_STATES]

    def _runtime(self, svc: types_pb2.Service) -> _Runtime:
        rt = self._rt.get(svc.id)
        lo, hi = svc.spec.service.min_replicas, svc.spec.service.max_replicas
        if rt is None or (rt.scaler.policy.min_replicas, rt.scaler.policy.max_replicas) != (lo, hi):
            p = self._policy
            policy = ScalePolicy(min_replicas=lo, max_replicas=hi, tolerance=p.tolerance,
                                 stabilization_s=p.stabilization_s, cooldown_s=p.cooldown_s,
                                 up_cooldown_s=p.up_cooldown_s, max_actions=p.max_actions,
                                 actions_window_s=p.actions_window_s)
            history = rt.history if rt else self._new_history()
            rt = _Runtime(scaler=Autoscaler(policy, self._clock), history=history,
                          lead_s=svc.lead_time_s or _DEFAULT_LEAD_S, capacity=rt.capacity if rt else 0.0,
                          saved_closed=rt.saved_closed if rt else 0)
            self._rt[svc.id] = rt
        return rt

    def _new_history(self) -> LoadHistory:
        return LoadHistory(bucket_s=self._bucket_s, season_buckets=max(1, round(86_400 / self._bucket_s)))

    async def _recover_histories(self) -> None:
        """Continue each running service's stored load history and capacity (read once, when leading starts).

        A stored history is untrusted: one that cannot be read, is corrupt or does not fit (another bucket
        size, too large, values out of range, a last bucket in the future, a gap over a season) is logged and
        the service starts with an empty history; nothing stops the other services or the tick.
        """
        for svc in list(self.services.values()):
            if svc.stopped:
                continue
            rt = self._runtime(svc)
            try:
                stored = await asyncio.to_thread(self._store.get_history, svc.id)
            except EtcdUnavailable as e:
                self._log.warning("service_history_unreadable", service_id=svc.id, reason=str(e))
                continue
            except GptrmError as e:
                self._log.warning("service_history_refused", service_id=svc.id, reason=str(e))
                continue
            if stored is None:
                continue
            history = self._new_history()
            try:
                history.restore(HistorySnapshot(stored.bucket_s, stored.last_bucket, tuple(stored.values),
                                                tuple(zip(stored.error_times_unix_s, stored.errors, strict=True))),
                                self._wall())
            except ValueError as e:
                self._log.warning("service_history_refused", service_id=svc.id, reason=str(e))
                continue
            if len(history) <= len(rt.history):
                continue   # this replica led before and kept a longer history in memory
            rt.history, rt.capacity, rt.saved_closed = history, stored.capacity or rt.capacity, history.closed
            self._log.info("service_history_restored", service_id=svc.id, buckets=len(history),
                           last_bucket=stored.last_bucket, capacity=rt.capacity)

    async def _save_history(self, svc: types_pb2.Service, rt: _Runtime) -> None:
        """Store the load history and capacity every ``history_save_buckets`` closed buckets (fenced)."""
        if rt.history.closed - rt.saved_closed < self._save_every:
            return
        snap = rt.history.snapshot()
        record = types_pb2.ServiceLoadHistory(
            service_id=svc.id, bucket_s=snap.bucket_s, last_bucket=snap.last_bucket, values=snap.values,
            error_times_unix_s=[t for t, _ in snap.errors], errors=[e for _, e in snap.errors],
            capacity=rt.capacity, saved_unix_s=self._wall())
        try:
            await self._leadership.write(self._store.put_history, record)
        except Fenced:
            raise
        except GptrmError as e:   # tried again after the next closed bucket
            self._log.warning("service_history_save_failed", service_id=svc.id, reason=str(e))
            return
        rt.saved_closed = rt.history.closed

    async def tick(self) -> None:
        """One pass over every service: measure, decide, store a change, make the replicas match."""
        for service_id in list(self.services):
            svc = self.services[service_id]
            rt = self._runtime(svc)
            replicas = self._replicas(service_id)
            if svc.stopped:
                if replicas:
                    await self._reconcile(svc, rt, replicas)   # desired 0: cancels what still runs
                self._export(svc, rt, replicas)
                continue
            self._measure_lead(rt, replicas)
            svc = await self._decide(svc, rt, replicas)
            await self._reconcile(svc, rt, replicas)
            self._export(svc, rt, replicas)

    def _measure_lead(self, rt: _Runtime, replicas: list[types_pb2.Task]) -> None:
        """Decision-to-ready time of each replica this leader asked for (EWMA over the samples)."""
        now = self._clock()
        by_id = {t.id: t for t in replicas}
        for tid, asked in list(rt.created.items()):
            task = by_id.get(tid)
            if task is None:
                del rt.created[tid]
            elif task.state == TaskState.RUNNING:
                sample = max(0.0, now - asked)
                rt.lead_s = sample if rt.lead_samples == 0 else 0.7 * rt.lead_s + 0.3 * sample
                rt.lead_samples += 1
                del rt.created[tid]

    def _signal(self, svc: types_pb2.Service, running: list[types_pb2.Task]) -> tuple[
            float | None, float | None, str, bool, float]:
        """``(signal, load, name, higher_is_worse, target)`` from the running replicas; None when unreadable."""
        spec = svc.spec
        if spec.service.target_util:
            utils: list[float] = []
            for t in running:
                for na in t.allocation.nodes:
                    sample = self._monitor.latest.get(na.node_id)
                    if sample is None:
                        continue
                    by_index = {g.index: g for g in sample.gpus}
                    utils.extend(by_index[i].util_gpu for i in na.gpu_indices
                                 if i in by_index and by_index[i].HasField("util_gpu"))
            if not utils:
                return None, None, "GPU utilization", True, spec.service.target_util
            mean = sum(utils) / len(utils)
            return mean, mean * len(running), "GPU utilization", True, spec.service.target_util
        fresh_since = self._wall() - _FRESH_S
        readings = [r for r in (self._monitor.task_qos(t.id) for t in running)
                    if r is not None and r.available and r.received_unix_s >= fresh_since]
        load_parts = [(r.requests_running or 0.0) + (r.requests_waiting or 0.0) for r in readings
                      if r.requests_running is not None or r.requests_waiting is not None]
        load = sum(load_parts) if load_parts else None
        if spec.qos.max_latency_ms:
            values = [r.latency_p95_s * 1000.0 for r in readings if r.latency_p95_s is not None]
            name, worse, target = "p95 latency ms", True, spec.qos.max_latency_ms
        else:
            values = [r.tokens_per_s for r in readings if r.tokens_per_s is not None]
            name, worse, target = "tokens/s", False, spec.qos.min_tokens_per_s
        if not values:
            return None, load, name, worse, target
        return sum(values) / len(values), load, name, worse, target

    async def _decide(self, svc: types_pb2.Service, rt: _Runtime,
                      replicas: list[types_pb2.Task]) -> types_pb2.Service:
        """Measure the signal and the load, forecast (also while pinned: the history keeps growing), and
        store a new count when autoscaling changes it."""
        running = [t for t in replicas if t.state == TaskState.RUNNING]
        signal, load, name, worse, target = self._signal(svc, running)
        now_wall = self._wall()
        forecast_replicas: int | None = None
        if load is not None and signal is not None and running and signal > 0:
            ratio = signal / target if worse else target / signal
            if ratio > 0.05:   # an idle service says nothing about what one replica can carry
                per_replica = (load / len(running)) / ratio
                rt.capacity = per_replica if not rt.capacity else 0.8 * rt.capacity + 0.2 * per_replica
        # A refit takes tens of milliseconds with days of history: off the event loop (only this loop
        # touches the history, one service at a time).
        fc = await asyncio.to_thread(_observe, rt.history, now_wall, load, rt.lead_s)
        await self._save_history(svc, rt)
        if rt.capacity > 0 and fc.model != "none":
            forecast_replicas = math.ceil(fc.peak / rt.capacity - 1e-9)
        view = rt.view
        view.signal = signal if signal is not None else math.nan
        view.load = load if load is not None else math.nan
        view.forecast_load, view.forecast_model, view.forecast_mape = fc.peak, fc.model, fc.mape
        view.forecast_replicas = forecast_replicas or 0
        view.lead_time_s = rt.lead_s
        if svc.pinned:
            return svc
        if signal is None:
            if not rt.frozen and running:
                rt.frozen = True
                self._events.publish("scale", f"service {svc.id}: {name} unavailable, count frozen at {svc.desired}",
                                     service_id=svc.id, reason="metrics unavailable")
            return svc
        rt.frozen = False
        starting = [t for t in replicas if t.state != TaskState.RUNNING]
        if starting and len(running) < svc.desired and any(
                self._clock() - rt.created.get(t.id, -math.inf) < _READY_WAIT_S for t in starting):
            return svc   # replicas on their way: the signal does not show them yet
        d = rt.scaler.decide(len(running) if len(running) < svc.desired else svc.desired, signal, target,
                             higher_is_worse=worse, forecast_replicas=forecast_replicas, signal_name=name)
        if not d.acted or d.desired == svc.desired:
            return svc
        new = types_pb2.Service()
        new.CopyFrom(svc)
        new.desired = d.desired
        new.lead_time_s = rt.lead_s     # stored with the decision: a new leader starts from it
        new.reason = d.reason + f" (forecast {fc.peak:.3g} by {fc.model} over {rt.lead_s:.0f} s, MAPE "
        new.reason += "n/a)" if math.isnan(fc.mape) else f"{fc.mape:.1f} %)"
        return await self._persist(svc, new, svc.desired)

    async def _persist(self, old: types_pb2.Service, new: types_pb2.Service, before: int) -> types_pb2.Service:
        if new.desired != before or new.pinned != old.pinned or new.stopped != old.stopped:
            new.decisions.insert(0, types_pb2.ScaleDecision(time_unix_s=self._wall(), from_replicas=before,
                                                            to_replicas=new.desired, reason=new.reason))
            del new.decisions[_DECISIONS_KEPT:]
        stored = await self._leadership.write(self._store.put, new)
        self._state.apply_service(stored)
        if stored.desired != before:
            direction = "up" if stored.desired > before else "down"
            self._metrics.actions.labels(stored.id, direction).inc()
        self._log.info("service_scaled", service_id=stored.id, before=before, desired=stored.desired,
                       pinned=stored.pinned, reason=stored.reason)
        rt = self._rt.get(stored.id)
        # Event fields go to publish() as keywords; none of these is its node_id or task_id.
        fields: dict[str, Any] = {"service_id": stored.id, "from": before, "to": stored.desired,
                                  "pinned": stored.pinned, "reason": stored.reason}
        if rt is not None:
            fields.update(forecast=f"{rt.view.forecast_load:.3g}", model=rt.view.forecast_model,
                          mape=f"{rt.view.forecast_mape:.3g}")
        self._events.publish("scale", f"service {stored.id} {before} → {stored.desired}: {stored.reason}", **fields)
        return stored

    def _spread(self, svc: types_pb2.Service, replicas: list[types_pb2.Task], spec: types_pb2.TaskSpec) -> list[str]:
        """Nodes a new replica should avoid: those its live siblings run on, as long as another ready node
        has the free GPUs it needs (replicas on separate nodes survive a node's failure); none when the
        service asked to pack (``pack_replicas``) or no other node has room."""
        if svc.spec.service.pack_replicas:
            return []
        hosting = {na.node_id for t in replicas if t.state not in TERMINAL_STATES for na in t.allocation.nodes}
        if not hosting:
            return []
        need = max(1, gpus_used(self._profiler.profile(spec).to_proto().gpus))
        for e in self._registry:
            if e.node_id not in hosting and self._registry.schedulable(e) \
                    and len(e.inventory.gpus) - len(set(e.reservation.gpu_indices)) >= need:
                return sorted(hosting)
        return []

    def _leaving(self, task: types_pb2.Task) -> bool:
        """The replica runs on a node being drained: it is replaced elsewhere before it stops."""
        for na in task.allocation.nodes:
            entry = self._registry.get(na.node_id)
            if entry is not None and entry.record.draining:
                return True
        return False

    async def _reconcile(self, svc: types_pb2.Service, rt: _Runtime, replicas: list[types_pb2.Task]) -> None:
        """Make the replicas match ``desired``.

        Indices at or above it are cancelled, highest first; a missing index is created (a dead replica's
        index is missing); a replica on a draining node gets a replacement first and is cancelled once the
        replacement runs; of two replicas with one index, the older one stays.
        """
        by_index: dict[int, list[types_pb2.Task]] = {}
        for t in replicas:
            if t.id in rt.cancelling:
                continue
            if (t.state == TaskState.PENDING and t.spec.constraints.avoid_nodes
                    and self._wall() - t.submit_unix_s > SPREAD_WAIT_S):
                # Spreading left it without a node that has room: place this index anywhere instead.
                with contextlib.suppress(IllegalTransition):
                    await self._tasks.cancel(t.id)
                rt.cancelling.add(t.id)
                rt.unspread.add(t.replica_index)
                self._log.info("replica_spread_dropped", service_id=svc.id, task_id=t.id, replica=t.replica_index)
                continue
            by_index.setdefault(t.replica_index, []).append(t)
        extra: list[types_pb2.Task] = []
        missing: list[int] = [i for i in range(svc.desired) if i not in by_index]
        for index, ts in by_index.items():
            if index >= svc.desired:
                extra.extend(ts)
                continue
            ts.sort(key=lambda t: (t.submit_unix_s, t.id))
            staying = [t for t in ts if not self._leaving(t)]
            leaving = [t for t in ts if self._leaving(t)]
            if not staying:
                missing.append(index)                  # drain: replace first, stop later
            elif staying[0].state == TaskState.RUNNING:
                extra.extend(leaving)                  # the replacement serves: the drained one may stop
            extra.extend(staying[1:])
        for t in sorted(extra, key=lambda t: -t.replica_index):
            try:
                await self._tasks.cancel(t.id)
                rt.cancelling.add(t.id)
                self._log.info("replica_removed", service_id=svc.id, task_id=t.id, replica=t.replica_index,
                               reason="drain" if self._leaving(t) else "scale-down")
            except IllegalTransition:
                pass
        rt.cancelling &= {t.id for t in replicas}
        open_nodes = sum(1 for e in self._registry if self._registry.schedulable(e))
        spreading = not svc.spec.service.pack_replicas and open_nodes > 1
        unplaced = any(not t.allocation.nodes for t in replicas if t.state == TaskState.PENDING)
        for index in sorted(missing):
            if spreading and unplaced and index not in rt.unspread:
                break   # spreading needs to know where the last new replica went: the next pass goes on
            spec = replica_spec(svc, index)
            if index not in rt.unspread:
                spec.constraints.avoid_nodes.extend(self._spread(svc, replicas, spec))
            rt.unspread.discard(index)
            unplaced = True
            task = await self._tasks.submit(spec, request_id="", service_id=svc.id, replica_index=index,
                                            submitted_by=svc.submitted_by)
            rt.created[task.id] = self._clock()
            self._log.info("replica_created", service_id=svc.id, task_id=task.id, replica=index)

    def _export(self, svc: types_pb2.Service, rt: _Runtime, replicas: list[types_pb2.Task]) -> None:
        m, sid = self._metrics, svc.id
        m.desired.labels(sid).set(svc.desired)
        m.running.labels(sid).set(sum(1 for t in replicas if t.state == TaskState.RUNNING))
        m.signal.labels(sid).set(rt.view.signal)
        m.load.labels(sid).set(rt.view.load)
        m.forecast.labels(sid).set(rt.view.forecast_load)
        m.forecast_replicas.labels(sid).set(rt.view.forecast_replicas)
        m.mape.labels(sid).set(rt.view.forecast_mape)
        m.lead.labels(sid).set(rt.lead_s)
