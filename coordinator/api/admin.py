"""The Admin gRPC service: what gptrmctl calls. Errors become status codes here, once.

- ValidationError → INVALID_ARGUMENT (the message names the field);
- NotFound → NOT_FOUND;
- PermissionDenied (a queue the caller's credential does not cover: a submit there, an action on
  a task or service there, a change of a queue not below its own; :mod:`coordinator.api.tenancy`)
  → PERMISSION_DENIED, which the auth interceptor audits as ``refused``;
- NotLeader → FAILED_PRECONDITION, with the leader's address in trailing metadata
  ``gptrm-leader-address`` so clients can follow it;
- IllegalTransition / Fenced → FAILED_PRECONDITION;
- PlacementError (a submitted task no known node could ever hold) → FAILED_PRECONDITION;
- EtcdUnavailable → UNAVAILABLE;
- Unavailable (a node's agent not connected) → UNAVAILABLE, with the refusal marker.

Every answer and streamed item passes through :func:`coordinator.api.tenancy.redacted`
(``AdminService._shown``, called by :func:`_rpc` and the streams): what a caller reads of a queue
it does not cover has its secret fields redacted.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc

from common.errors import (
    CoordinationError,
    EtcdUnavailable,
    Fenced,
    IllegalTransition,
    NotFound,
    NotLeader,
    PermissionDenied,
    PlacementError,
    Unavailable,
    ValidationError,
)
from common.logging import get_logger
from common.oci import validate_container
from common.pb.gptrm.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from common.pbenum import pb_enum
from common.types import MIN_POLICY_THRESHOLD, TERMINAL_STATES, NodeState
from coordinator.api.auth import QUEUE_ADMIN, current_principal, queue_refusal
from coordinator.api.deps import AdminDeps
from coordinator.api.pages import page_in_order, paginate
from coordinator.api.task_filter import filter_given, task_matcher
from coordinator.api.tenancy import act_refusal, covers, queue_change_refusal, redacted, usage_filter
from coordinator.events import KINDS, Event
from coordinator.monitor.nodes import NodeEntry, stored_state
from coordinator.queues.admin import queue_from_proto, queue_to_proto
from coordinator.rpc_metadata import LEADER_METADATA_KEY, NOT_LEADER_METADATA_KEY, REFUSED_METADATA_KEY
from coordinator.scheduler.policy import threshold_mode
from coordinator.sync.lock import settle
from coordinator.sync.usage import hours_between
from coordinator.usage.report import BY, Prices, summarize
from coordinator.version import VERSION

__all__ = ["SERVED_BY", "AdminService", "Served", "not_leader_message"]

_EVENT_KINDS = {name: admin_pb2.EventKind.Value(f"EVENT_KIND_{name.upper()}") for name in KINDS}
R = TypeVar("R")
Ctx = grpc.aio.ServicerContext
"""The servicer context gRPC passes to every method."""
_log = get_logger("admin")

USAGE_DEFAULT_S = 7 * 86400.0
"""GetUsage's period when ``since_unix_s`` is 0: the last seven days."""
USAGE_MAX_S = 400 * 86400.0
"""The longest period one GetUsage reads."""


_ADDRESS = re.compile(r"(?:[a-z][a-z0-9+.-]*://)?(?:\[[0-9a-fA-F:.]+\]|\d{1,3}(?:\.\d{1,3}){3}|[\w.-]+)?:\d{2,5}\b"
                      r"|\b\d{1,3}(?:\.\d{1,3}){3}\b")


def redact(text: str) -> str:
    """``text`` with network addresses (``host:port``, IP addresses, URLs with a port) replaced."""
    return _ADDRESS.sub("<address>", text)


class Served(enum.Enum):
    """Which replicas answer an Admin method."""

    ANY = "any"
    """Every replica, from its own memory (its status, its event log)."""
    STORED = "stored"
    """The leader from its memory; a standby from what etcd holds (the leader's writes), or from its own memory
    marked ``stale`` when etcd does not answer."""
    LEADER = "leader"
    """The leader alone: a standby redirects the call (``NotLeader`` with the leader's address, which gptrmctl
    follows) before it reads the request, since its checks need the leader's tables (queues, tasks, nodes,
    the policy in force). On the leader the call runs to its end even if its client goes away meanwhile."""


SERVED_BY: Mapping[str, Served] = {
    "GetStatus": Served.ANY, "StreamEvents": Served.ANY,
    "ListNodes": Served.STORED, "GetNode": Served.STORED, "ListTasks": Served.STORED, "GetTask": Served.STORED,
    "GetPolicy": Served.STORED, "ListQueues": Served.STORED, "GetService": Served.STORED, "GetUsage": Served.STORED,
    "SubmitTask": Served.LEADER, "CancelTask": Served.LEADER, "PauseTask": Served.LEADER,
    "ResumeTask": Served.LEADER, "TaskLogs": Served.LEADER,
    "DrainNode": Served.LEADER, "CordonNode": Served.LEADER, "UncordonNode": Served.LEADER,
    "RemoveNode": Served.LEADER, "SetPolicy": Served.LEADER, "SetQueue": Served.LEADER,
    "RemoveQueue": Served.LEADER, "CreateService": Served.LEADER, "ScaleService": Served.LEADER,
    "CancelService": Served.LEADER, "ResumeGpus": Served.LEADER, "PullImage": Served.LEADER,
    "CancelArray": Served.LEADER, "CancelTasks": Served.LEADER, "Session": Served.LEADER,
    "CreateReservation": Served.LEADER, "ListReservations": Served.LEADER, "RemoveReservation": Served.LEADER,
}
"""Where each Admin method is answered: the one place a standby decides to redirect or serve
(:meth:`AdminService._route`, called before a method's own code). Every method of the service is listed."""


def _submit_key(t: types_pb2.Task) -> tuple:
    """The order of task listings: submit time, then id."""
    return t.submit_unix_s, t.id


def _rpc(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Route the call (:data:`SERVED_BY`), then translate gptrm errors into gRPC status codes; anything
    unexpected is INTERNAL, never a crash. The answer is what the caller may read of it
    (:func:`~coordinator.api.tenancy.redacted`)."""

    @functools.wraps(fn)
    async def wrapper(self: AdminService, request: Any, context: Ctx) -> R:
        try:
            if self._route(fn.__name__) is Served.LEADER:
                # A change, once begun, runs to its end even when the client goes away (its deadline passes):
                # an etcd write and its application to the leader's memory are never separated.
                return self._shown(await settle(fn(self, request, context)))
            return self._shown(await fn(self, request, context))
        except ValidationError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except NotFound as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except PermissionDenied as e:   # the interceptor audits the answer as refused
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        except NotLeader as e:
            if self._app.leadership.stale:
                # No leader because etcd is unreachable from here: a refusal with its cause, not a
                # leader change worth waiting out.
                context.set_trailing_metadata(((REFUSED_METADATA_KEY, "etcd-unavailable"),))
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd unavailable, no leader: {e}")
            metadata = [(NOT_LEADER_METADATA_KEY, "1")]
            if e.leader_address:
                metadata.append((LEADER_METADATA_KEY, e.leader_address))
            context.set_trailing_metadata(tuple(metadata))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._not_leader(e))
        except Fenced as e:   # the lease was lost during the write: nothing applied, retry on the new leader
            context.set_trailing_metadata(((NOT_LEADER_METADATA_KEY, "1"),))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except (IllegalTransition, PlacementError) as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except EtcdUnavailable as e:
            # UNAVAILABLE also means "no connection" to a client; the marker says this
            # coordinator answered and refused (gptrmctl exits 1 with the reason, not 3).
            context.set_trailing_metadata(((REFUSED_METADATA_KEY, "etcd-unavailable"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"etcd unavailable: {redact(str(e))}")
        except CoordinationError as e:   # an admin lock held elsewhere for too long
            await context.abort(grpc.StatusCode.ABORTED, redact(str(e)))
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            # A bug: the client gets an id to quote, the log gets the traceback; no internal detail leaks.
            correlation_id = uuid.uuid4().hex[:12]
            _log.exception("admin_rpc_failed", method=fn.__name__, correlation_id=correlation_id,
                           reason=type(e).__name__)
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"internal error in {fn.__name__} (correlation id {correlation_id}; "
                                "the coordinator's log has the details)")
        raise AssertionError("unreachable")  # context.abort raises

    return wrapper


_SESSION_OPEN_S = 10.0
"""How long a Session waits for its first (open) message."""


def _stream_rpc(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """A leader-only streaming method, its errors turned into status codes as :func:`_rpc` turns them (a
    PermissionDenied is passed on: the auth interceptor answers and audits it)."""

    @functools.wraps(fn)
    async def wrapper(self: AdminService, request: Any, context: Ctx) -> AsyncIterator[Any]:
        try:
            self._route(fn.__name__)   # agents stream to the leader only
            async for item in fn(self, request, context):
                yield item
        except ValidationError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except NotFound as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except NotLeader as e:   # marked as _rpc marks it: gptrmctl follows the address, or waits for a leader
            metadata = [(NOT_LEADER_METADATA_KEY, "1")]
            if e.leader_address:
                metadata.append((LEADER_METADATA_KEY, e.leader_address))
            context.set_trailing_metadata(tuple(metadata))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._not_leader(e))
        except Unavailable as e:
            context.set_trailing_metadata(((REFUSED_METADATA_KEY, "node-unavailable"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    return wrapper


def not_leader_message(replica_id: str, error: NotLeader, *, holds_lease: bool) -> str:
    """What a client is told when ``replica_id`` refuses a request with ``error``.

    The replica that answered and the replica it names as leader are told apart: a replica that
    names itself is between winning the election and leading (taking over), or has lost its lease
    while its leader record has not expired yet; either way the request is worth trying again.

    :param holds_lease: whether ``replica_id`` still holds the leader lease.
    """
    if error.leader_id and error.leader_id == replica_id:
        if holds_lease:
            return f"{replica_id} is taking over as leader; try again"
        return f"{replica_id} has just lost the leadership and no other leader is known yet; try again"
    return str(error)


def _require_id(value: str, field: str) -> str:
    if not value or not value.strip():
        raise ValidationError(field, "must not be empty")
    if len(value) > 253 or any(c.isspace() or c == "/" for c in value):
        raise ValidationError(field, f"invalid id {value!r}")
    return value


class AdminService(admin_pb2_grpc.AdminServicer):
    """Admin API over one replica's components.

    :param app: the replica's components (the ``App`` from ``coordinator.app.build``).
    :param auth_mode: how callers authenticate (``none``, ``tls``, ``token``…), reported by GetStatus.
    """

    def __init__(self, app: AdminDeps, *, auth_mode: str = "none") -> None:
        self._app = app
        self.auth_mode = auth_mode

    def _shown(self, answer: R) -> R:
        """``answer`` as the caller may read it: the one redaction point of every Admin answer and streamed item."""
        caller = current_principal()
        if caller is None or caller.cluster_admin:
            return answer
        return redacted(answer, caller, self._app.queue_admin.config)

    def _not_leader(self, error: NotLeader) -> str:
        leadership = self._app.leadership
        return not_leader_message(leadership.id, error, holds_lease=leadership.election.is_leader)

    def _route(self, method: str) -> Served:
        """Redirect a call this replica must not answer (:data:`SERVED_BY`); returns where ``method`` is served.

        :raises NotLeader: a leader-only method on a replica that does not lead.
        """
        served = SERVED_BY[method]
        if served is Served.LEADER:
            self._app.leadership.require_leader()
        return served

    def _view(self, entry: NodeEntry) -> admin_pb2.NodeView:
        view = admin_pb2.NodeView(record=entry.stored_view(), state=pb_enum(types_pb2.NodeState, entry.state),
                                  dropped_samples_total=entry.dropped_samples_total,
                                  task_ids=sorted(entry.task_ids))
        latest = self._app.monitor.latest.get(entry.node_id)
        if latest is not None:
            view.latest.CopyFrom(latest)
            view.has_latest = True
        if entry.last_seen_unix_s:
            view.last_seen_age_s = max(0.0, time.time() - entry.last_seen_unix_s)
        for tid in sorted(entry.task_ids):
            task = self._app.tasks.find(tid)
            if task is not None:
                view.allocations.extend(a for a in task.allocation.nodes if a.node_id == entry.node_id)
        if entry.inventory.gpus:
            curve, source, samples = self._app.snapshots.power_curve(entry)
            view.power_curve.CopyFrom(admin_pb2.PowerCurveView(idle_w=curve.idle_w, max_w=curve.max_w,
                                                               source=source, samples=samples))
        return view

    @_rpc
    async def GetStatus(self, request: admin_pb2.GetStatusRequest, context: Ctx) -> admin_pb2.ClusterStatus:
        app, leadership = self._app, self._app.leadership
        leader_id, address, epoch = leadership.leader_info()
        o, rate = app.monitor.objectives, app.telemetry_rate
        node_counts, gpus_total, gpus_alloc = app.registry.summary()
        return admin_pb2.ClusterStatus(
            coordinator_id=leadership.id, is_leader=leadership.is_leader, leader_id=leader_id,
            leader_address=address,
            leader_epoch=epoch, uptime_s=time.monotonic() - app.started, version=VERSION, stale=leadership.stale,
            nodes_by_state=[admin_pb2.CountEntry(key=k, count=v) for k, v in sorted(node_counts.items())],
            tasks_by_state=[admin_pb2.CountEntry(key=k, count=v) for k, v in sorted(app.tasks.counts().items())],
            objectives=admin_pb2.ClusterObjectives(util_mean=o.util_mean, util_std=o.util_std, power_w=o.power_w,
                                                   gpu_mem_util=o.gpu_mem_util, energy_j=o.energy_j),
            policy=_with_mode(app.policy.current), gpus_total=gpus_total, gpus_allocated=gpus_alloc,
            insecure=app.cfg.insecure, auth=self.auth_mode,
            quarantined_keys=app.store.quarantined_keys,
            telemetry_rejected_total=sum(app.monitor.rejected.values()),
            leader_duties=[admin_pb2.LeaderDutyStatus(name=v.name, state=v.state, failures=v.failures,
                                                      last_pass_age_s=v.last_pass_age_s or 0.0,
                                                      has_last_pass=v.last_pass_age_s is not None,
                                                      last_error=v.last_error)
                           for v in app.supervisor.views()],
            telemetry_rate=admin_pb2.TelemetryRateStatus(
                report_interval_s=rate.report_interval_s, sampling_interval_s=rate.sampling_interval_s,
                ingest_budget_per_s=rate.budget_per_s, ingest_per_s=rate.ingest_per_s, reporting_nodes=rate.nodes),
        )

    async def _from_etcd(self, fn: Callable[..., R], *args: Any) -> tuple[bool, R | None]:
        """A standby's read from etcd (the leader's writes): (True, result); (False, None) on the
        leader, or when etcd does not answer, and the caller serves its own memory (marked stale)."""
        if self._app.leadership.leading or self._app.leadership.stale:
            return False, None
        try:
            return True, await asyncio.to_thread(fn, *args)
        except EtcdUnavailable:
            return False, None

    async def node_views(self) -> tuple[list[admin_pb2.NodeView], bool]:
        """Every node as ListNodes answers it, unpaginated, and whether the answer is stale (a standby's from
        its memory): what ListNodes pages through, and what the web console reads whole (nodes hold no
        secret field)."""
        read, records = await self._from_etcd(self._app.store.list_nodes)
        views = [_stored_view(r) for r in records or ()] if read else [self._view(e) for e in self._app.registry]
        return views, not read and self._app.leadership.stale

    @_rpc
    async def ListNodes(self, request: admin_pb2.ListNodesRequest, context: Ctx) -> admin_pb2.ListNodesResponse:
        for s in request.states:
            if s not in types_pb2.NodeState.values() or s == 0:
                raise ValidationError("states", f"unknown node state {s}")
        wanted = set(request.states)
        views, stale = await self.node_views()
        views = [v for v in views if not wanted or v.state in wanted]
        page, token = paginate(views, lambda v: (v.record.inventory.node_id,), request.page_size, request.page_token)
        return admin_pb2.ListNodesResponse(nodes=page, stale=stale, next_page_token=token)

    @_rpc
    async def GetNode(self, request: admin_pb2.GetNodeRequest, context: Ctx) -> admin_pb2.NodeView:
        node_id = _require_id(request.node_id, "node_id")
        read, record = await self._from_etcd(self._app.store.get_node, node_id)
        if read and record is not None:
            return _stored_view(record)
        entry = self._app.registry.get(node_id)
        if entry is None:
            raise NotFound(f"node {node_id!r} not found")
        return self._view(entry)

    @_rpc
    async def ListTasks(self, request: admin_pb2.ListTasksRequest, context: Ctx) -> admin_pb2.ListTasksResponse:
        for s in request.states:
            if s not in types_pb2.TaskState.values() or s == 0:
                raise ValidationError("states", f"unknown task state {s}")
        read, stored = await self._from_etcd(self._app.store.list_tasks)
        wanted = set(request.states)
        keep = task_matcher(request.filter)

        def listed(t: types_pb2.Task) -> bool:
            return (not wanted or t.state in wanted) and keep(t)

        if read and stored is not None:
            page, token = paginate([t for t in stored if listed(t)], _submit_key, request.page_size,
                                   request.page_token)
        else:   # memory keeps the tasks in this order: a page reads only itself
            page, token = page_in_order(
                lambda after: (t for t in self._app.tasks.in_submit_order(after) if listed(t)),
                _submit_key, request.page_size, request.page_token)
        return admin_pb2.ListTasksResponse(tasks=page, stale=self._app.leadership.stale, next_page_token=token)

    @_rpc
    async def GetUsage(self, request: admin_pb2.UsageRequest, context: Ctx) -> admin_pb2.UsageReport:
        now = time.time()
        for name in ("since_unix_s", "until_unix_s"):
            value = getattr(request, name)
            if not (math.isfinite(value) and 0 <= value <= 1e11):
                raise ValidationError(name, f"must be a time in unix seconds, got {value}")
        until = request.until_unix_s or now
        since = request.since_unix_s or until - USAGE_DEFAULT_S
        if not since < until:
            raise ValidationError("since_unix_s", f"{since} is not before until_unix_s {until}")
        if until - since > USAGE_MAX_S:
            raise ValidationError("until_unix_s", f"the period is {(until - since) / 86400:.0f} days; at most "
                                  f"{USAGE_MAX_S / 86400:.0f}")
        by = request.by or "queue"
        if by not in BY:
            raise ValidationError("by", f"must be one of {', '.join(BY)}, got {by!r}")
        hours = hours_between(since, until)
        stored, accounted = await self._app.usage.report(since, until, now)
        cfg = self._app.cfg
        prices = Prices(cfg.gpu_hour_prices, cfg.price_kwh)
        shown = usage_filter(current_principal(), self._app.queue_admin.config)
        hours_read = (stored[h] for h in sorted(stored)) if shown is None else \
            ({key: used for key, used in stored[h].items() if shown(key.queue)} for h in sorted(stored))
        report = summarize(hours_read, by=by, prices=prices)
        out = admin_pb2.UsageReport(
            since_unix_s=hours[0] if hours else since, until_unix_s=hours[-1] + 3600 if hours else until, by=by,
            accounted_until_unix_s=accounted or 0.0, price_gpu_hour=prices.per_gpu_hour, price_kwh=prices.per_kwh,
            rows=[admin_pb2.UsageReportRow(key=r.key, gpu_hours_by_model=r.gpu_hours_by_model, gpu_hours=r.gpu_hours,
                                           cpu_core_hours=r.cpu_core_hours, energy_kwh=r.energy_kwh, cost=r.cost,
                                           tasks=r.tasks) for r in report])
        if self._app.leadership.leading:
            out.budgets.extend(b for b in self._app.queue_admin.budget_readings() if shown is None or shown(b.queue))
        return out

    @_rpc
    async def GetTask(self, request: admin_pb2.GetTaskRequest, context: Ctx) -> types_pb2.Task:
        task_id = _require_id(request.task_id, "task_id")
        read, task = await self._from_etcd(self._app.store.get_task, task_id)
        if not read:
            task = types_pb2.Task()
            task.CopyFrom(self._app.tasks.get(task_id))   # a copy: the reading below is never stored
        if task is None:
            raise NotFound(f"task {task_id!r} not found")
        reading = self._app.monitor.task_qos(task_id)
        if reading is not None:
            task.qos_reading.CopyFrom(reading.to_proto())
        if task.state not in TERMINAL_STATES:
            task.energy_j += self._app.monitor.task_energy.current(task_id)   # so far; stored when it ends
            if task.spec.HasField("elastic") and self._app.leadership.leading:
                # The curve learned so far (stored only with each resize).
                del task.elastic.curve[:]
                task.elastic.curve.extend(types_pb2.ElasticPoint(gpus=n, throughput=t)
                                          for n, t in self._app.elastic.curve(task).points)
                task.elastic.interval_s = self._app.elastic.settings.interval_s
                task.elastic.grow_blocked = self._app.elastic.grow_blocked(task.id)
        return task

    @_rpc
    async def SubmitTask(self, request: admin_pb2.SubmitTaskRequest, context: Ctx) -> types_pb2.Task:
        if not request.HasField("spec"):
            raise ValidationError("spec", "is required")
        if len(request.request_id) > 128:
            raise ValidationError("request_id", "longer than 128 characters")
        # The door: a task no known node could hold even empty is refused, unless the operator queues it anyway.
        admit = (lambda task: None) if request.queue_unplaceable else self._app.admission.check
        queue, submitter = self._queue_for(request.spec)
        self._check_host_paths(request.spec, queue)
        # An array is created whole by this one call; the answer is its first element (Task.array_id names it).
        submit = self._app.tasks.submit_array if request.spec.HasField("array") else self._app.tasks.submit
        return await submit(request.spec, request.request_id, admit=admit, queue=queue, submitted_by=submitter)

    @_rpc
    async def PullImage(self, request: admin_pb2.PullImageRequest,
                        context: Ctx) -> admin_pb2.PullImageResponse:
        """Pre-pull an image on nodes (an admin's call: archives only below the cluster's --mount-allowed)."""
        if not request.image:
            raise ValidationError("image", "is required")
        validate_container(request.image, [], "", 0, allowed=self._app.cfg.mount_allowed, image_field="image")
        if len(request.nodes) > 10_000:
            raise ValidationError("nodes", f"{len(request.nodes)} nodes is more than 10000")
        return admin_pb2.PullImageResponse(nodes=self._app.nodes.pull_image(request.image, list(request.nodes)))

    def _check_host_paths(self, spec: types_pb2.TaskSpec, queue: str) -> None:
        """A container's host paths (mounts, image archives) lie below the roots the cluster allows
        (``--mount-allowed``) or those of the task's queue and the queues above it (docs/containers.md).

        :raises ValidationError: naming ``spec.mounts[i]`` or ``spec.image``."""
        config = self._app.queue_admin.config
        chain = (queue, *config.ancestors(queue)) if queue in config else ()
        allowed = [*self._app.cfg.mount_allowed, *(root for name in chain for root in config.get(name).mount_allowed)]
        validate_container(spec.image, spec.mounts, spec.workdir, spec.shm_bytes, allowed=allowed)

    def _queue_for(self, spec: types_pb2.TaskSpec) -> tuple[str, str]:
        """The team queue a submission goes to, and who submits it.

        :raises PermissionDenied: the caller may not submit to that queue (audited as refused).
        :raises ValidationError: no such queue, or none named and the caller has no default."""
        principal = current_principal()
        queue = self._app.queue_admin.resolve(spec.queue, principal)
        refusal = queue_refusal(principal, queue) if principal is not None and principal.via != "none" else None
        if refusal is not None and principal is not None and principal.role == QUEUE_ADMIN \
                and covers(principal, self._app.queue_admin.config, queue):
            refusal = None   # a queue admin submits anywhere below its queues
        if refusal is not None:
            raise refusal
        return queue, principal.name if principal is not None else ""

    def _own_task(self, task_id: str) -> str:
        """``task_id``, once the caller may act on that task (its queue is one the caller covers). Called by
        leader-only methods, after :meth:`_route` made sure this replica leads (where the task is known).

        :raises NotFound: no such task.
        :raises PermissionDenied: the task's queue is not the caller's (audited as refused)."""
        self._may_act(self._app.tasks.get(task_id).queue, f"task {task_id}")
        return task_id

    def _own_service(self, service_id: str) -> str:
        """``service_id``, once the caller may act on that service (as :meth:`_own_task`)."""
        svc = self._app.services.services.get(service_id)
        if svc is None:
            raise NotFound(f"service {service_id!r} not found")
        self._may_act(svc.spec.queue, f"service {service_id}")
        return service_id

    def _may_act(self, queue: str, target: str) -> None:
        """:raises PermissionDenied: the caller does not cover ``queue`` (``target`` names what it asked for)."""
        refusal = act_refusal(current_principal(), self._app.queue_admin.config, queue, target)
        if refusal is not None:
            raise refusal

    @_rpc
    async def CancelTask(self, request: admin_pb2.TaskRef, context: Ctx) -> types_pb2.Task:
        return await self._app.tasks.cancel(self._own_task(_require_id(request.task_id, "task_id")))

    @_rpc
    async def CancelTasks(self, request: admin_pb2.CancelTasksRequest,
                          context: Ctx) -> admin_pb2.CancelTasksResponse:
        """Cancel every unfinished task the filter (and ``task_ids``, when given) names, of those the caller may
        act on (:func:`~coordinator.api.tenancy.act_refusal`); the rest it names are counted as refused and
        left alone. One call, judged on the leader's table, so a dry run and the cancel it confirms see the
        same rules; ``task_ids`` keeps the cancel to what the dry run counted."""
        if not filter_given(request.filter):
            raise ValidationError("filter", "name at least one of users, queues, name or states")
        keep = task_matcher(request.filter)
        only = set(request.task_ids)
        if len(only) > 100_000:
            raise ValidationError("task_ids", "at most 100000")
        out = admin_pb2.CancelTasksResponse()
        chosen: list[str] = []
        for task in self._app.tasks.values():
            if task.state in TERMINAL_STATES or not keep(task):
                continue
            if act_refusal(current_principal(), self._app.queue_admin.config, task.queue, f"task {task.id}"):
                out.refused += 1
            elif not only or task.id in only:
                chosen.append(task.id)
        chosen.sort()
        if request.dry_run:
            out.task_ids.extend(chosen)
            return out
        for task_id in chosen:
            try:
                await self._app.tasks.cancel(task_id)
            except (IllegalTransition, NotFound) as e:   # ended or forgotten meanwhile
                _log.info("bulk_cancel_skipped", task_id=task_id, reason=str(e))
                out.failed += 1
                continue
            out.task_ids.append(task_id)
        return out

    @_rpc
    async def CancelArray(self, request: admin_pb2.ArrayRef, context: Ctx) -> admin_pb2.CancelArrayResponse:
        array_id = _require_id(request.array_id, "array_id")
        elements = self._app.tasks.array_elements(array_id)
        if not elements:
            raise NotFound(f"array {array_id!r} not found")
        self._may_act(elements[0].queue, f"array {array_id}")
        cancelled, ended = await self._app.tasks.cancel_array(array_id)
        return admin_pb2.CancelArrayResponse(array_id=array_id, cancelled=cancelled, already_ended=ended)

    @_rpc
    async def PauseTask(self, request: admin_pb2.TaskRef, context: Ctx) -> types_pb2.Task:
        return await self._app.tasks.pause(self._own_task(_require_id(request.task_id, "task_id")))

    @_rpc
    async def ResumeTask(self, request: admin_pb2.TaskRef, context: Ctx) -> types_pb2.Task:
        return await self._app.tasks.resume(self._own_task(_require_id(request.task_id, "task_id")))

    async def _node_op(self, request: admin_pb2.NodeRef, **state: bool) -> admin_pb2.NodeView:
        node_id = _require_id(request.node_id, "node_id")
        return self._view(await self._app.nodes.set_admin_state(node_id, **state))

    @_rpc
    async def DrainNode(self, request: admin_pb2.NodeRef, context: Ctx) -> admin_pb2.NodeView:
        return await self._node_op(request, cordoned=True, draining=True)

    @_rpc
    async def CordonNode(self, request: admin_pb2.NodeRef, context: Ctx) -> admin_pb2.NodeView:
        return await self._node_op(request, cordoned=True)

    @_rpc
    async def UncordonNode(self, request: admin_pb2.NodeRef, context: Ctx) -> admin_pb2.NodeView:
        return await self._node_op(request, cordoned=False, draining=False)

    @_rpc
    async def ResumeGpus(self, request: admin_pb2.ResumeGpusRequest, context: Ctx) -> admin_pb2.NodeView:
        """Put fenced GPUs back in service after repair (role admin; audited as every admin call)."""
        node_id = _require_id(request.node_id, "node_id")
        principal = current_principal()
        by = principal.name if principal is not None else "admin"
        return self._view(await self._app.nodes.health.resume(node_id, list(request.gpu_indices), by))

    @_rpc
    async def CreateReservation(self, request: types_pb2.Reservation,
                                context: Ctx) -> admin_pb2.ReservationView:
        """Keep GPUs for a queue's or users' work in a window (role admin; audited as every admin call)."""
        principal = current_principal()
        return await self._app.reservations.create(request, principal.name if principal is not None else "")

    @_rpc
    async def ListReservations(self, request: admin_pb2.ListReservationsRequest,
                               context: Ctx) -> admin_pb2.ListReservationsResponse:
        return self._app.reservations.views()

    @_rpc
    async def RemoveReservation(self, request: admin_pb2.ReservationRef, context: Ctx) -> admin_pb2.ReservationView:
        return await self._app.reservations.remove(_require_id(request.name, "name"))

    @_rpc
    async def RemoveNode(self, request: admin_pb2.NodeRef, context: Ctx) -> admin_pb2.NodeView:
        node_id = _require_id(request.node_id, "node_id")
        record = await self._app.lost_nodes.remove(node_id)
        return admin_pb2.NodeView(record=record, state=pb_enum(types_pb2.NodeState, NodeState.LOST))

    @_rpc
    async def GetPolicy(self, request: admin_pb2.GetPolicyRequest, context: Ctx) -> types_pb2.Policy:
        read, stored = await self._from_etcd(self._app.store.get_policy)
        return _with_mode(stored if read and stored is not None else self._app.policy.current)

    @_rpc
    async def SetPolicy(self, request: types_pb2.Policy, context: Ctx) -> types_pb2.Policy:
        if not request.name:
            raise ValidationError("name", "must not be empty")
        # 0 on the wire means "keep the current threshold", "" "keep the current mode" (proto3 has no presence).
        current = self._app.policy.current
        threshold = request.threshold or current.threshold
        if not math.isfinite(threshold) or not MIN_POLICY_THRESHOLD <= threshold <= 1:
            raise ValidationError("threshold", f"must be in [{MIN_POLICY_THRESHOLD}, 1], got {request.threshold}")
        mode = request.threshold_mode or threshold_mode(current)
        return await self._app.policy.set(types_pb2.Policy(name=request.name, threshold=threshold,
                                                           threshold_mode=mode))

    @_rpc
    async def ListQueues(self, request: admin_pb2.ListQueuesRequest, context: Ctx) -> admin_pb2.ListQueuesResponse:
        if self._app.leadership.leading:
            return self._app.queue_admin.views(request.name)
        return await self._app.queue_admin.stored_views(request.name)

    @_rpc
    async def SetQueue(self, request: admin_pb2.SetQueueRequest, context: Ctx) -> admin_pb2.QueueView:
        if not request.HasField("queue"):
            raise ValidationError("queue", "is required")
        self._may_change_queue(request.queue.name, request.queue.parent or None,   # before judging what it asks
                               tuple(request.queue.default_for))
        done = await self._app.queue_admin.set(queue_from_proto(request.queue))
        view = self._app.queue_admin.views(done.queue.name).queues[0]
        view.existing_work = done.existing_work
        return view

    @_rpc
    async def RemoveQueue(self, request: admin_pb2.QueueRef, context: Ctx) -> admin_pb2.QueueView:
        name = _require_id(request.name, "name")
        config = self._app.queue_admin.config
        self._may_change_queue(name, config.get(name).parent if config.managed and name in config else None)
        removed = await self._app.queue_admin.remove(name)
        return admin_pb2.QueueView(queue=queue_to_proto(removed))

    def _may_change_queue(self, name: str, parent: str | None, default_for: tuple[str, ...] = ()) -> None:
        """Refuse a change of queue ``name`` (to sit under ``parent``, the default of ``default_for``; a removal:
        none) unless the caller may make it (:func:`~coordinator.api.tenancy.queue_change_refusal`), judged on
        the leader's tree.

        :raises NotLeader: on a standby. :raises PermissionDenied: audited as refused."""
        self._app.leadership.require_leader()
        refusal = queue_change_refusal(current_principal(), self._app.queue_admin.config, name, parent, default_for)
        if refusal is not None:
            raise refusal

    @_rpc
    async def CreateService(self, request: admin_pb2.SubmitTaskRequest, context: Ctx) -> types_pb2.Service:
        if not request.HasField("spec"):
            raise ValidationError("spec", "is required")
        spec = types_pb2.TaskSpec()
        spec.CopyFrom(request.spec)
        spec.queue, submitter = self._queue_for(spec)   # its replicas run in the queue resolved now
        self._check_host_paths(spec, spec.queue)
        return await self._app.services.create(spec, request.request_id, submitted_by=submitter)

    @_rpc
    async def GetService(self, request: admin_pb2.ServiceRef, context: Ctx) -> admin_pb2.ServiceView:
        service_id = _require_id(request.service_id, "service_id")
        if self._app.leadership.leading and service_id in self._app.services.services:
            return self._app.services.view(service_id)
        # A standby (or a leader still reading etcd): the stored record and replicas; the signal and the
        # forecast live on the leader.
        tasks = await asyncio.to_thread(self._app.store.list_tasks)
        return await self._app.services.stored_view(service_id, tasks)

    @_rpc
    async def ScaleService(self, request: admin_pb2.ScaleServiceRequest, context: Ctx) -> types_pb2.Service:
        service_id = _require_id(request.service_id, "service_id")
        if request.auto and request.replicas:
            raise ValidationError("replicas", "give a count or auto, not both")
        if not request.auto and not request.replicas:
            raise ValidationError("replicas", "must be at least 1 (or auto)")
        return await self._app.services.scale(self._own_service(service_id),
                                              None if request.auto else request.replicas)

    @_rpc
    async def CancelService(self, request: admin_pb2.ServiceRef, context: Ctx) -> types_pb2.Service:
        return await self._app.services.cancel(self._own_service(_require_id(request.service_id, "service_id")))

    async def StreamEvents(self, request: admin_pb2.StreamEventsRequest, context: Ctx):
        backlog = request.backlog or 100
        task_id = request.task_id
        if len(task_id) > 253:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id: longer than 253 characters")
        queue = self._app.events.subscribe() if request.follow else None
        try:
            # With a task named, the backlog is its last events among every retained one.
            recent = self._app.events.recent(1000 if task_id else min(backlog, 1000))
            for e in [e for e in recent if not task_id or e.task_id == task_id][-min(backlog, 1000):]:
                yield self._shown(_event_pb(e))
            while queue is not None:
                e = await queue.get()
                if not task_id or e.task_id == task_id:
                    yield self._shown(_event_pb(e))
        finally:
            if queue is not None:
                self._app.events.unsubscribe(queue)

    @_stream_rpc
    async def TaskLogs(self, request: admin_pb2.TaskLogsRequest, context: Ctx) -> AsyncIterator[Any]:
        """A task's output (one part's: ``rank``) from its node's agent: output can hold secrets, so only to a
        caller that covers the task's queue (a refusal, PermissionDenied, is answered and audited by the
        auth interceptor)."""
        task_id = self._own_task(_require_id(request.task_id, "task_id"))
        task = self._app.tasks.get(task_id)
        async for chunk in self._app.logs.stream(task, request.tail_lines, request.follow, request.rank):
            yield self._shown(chunk)

    @_stream_rpc
    async def Session(self, request_iterator: AsyncIterator[admin_pb2.TaskSessionInput],
                      context: Ctx) -> AsyncIterator[Any]:
        """An interactive session with a running task (attach to its terminal, or exec a command in its context;
        docs/interactive.md), relayed to and from its node's agent. Only to a caller that may act on the task's
        queue (as TaskLogs: a submitter of that queue, its queue admin, the cluster admin); the auth
        interceptor audits every session when it ends, and every refusal."""
        try:
            first = await asyncio.wait_for(anext(request_iterator), timeout=_SESSION_OPEN_S)
        except (TimeoutError, StopAsyncIteration):
            raise ValidationError("open", "the first message must open the session") from None
        if not first.HasField("open"):
            raise ValidationError("open", "the first message must open the session")
        opened = first.open
        task = self._app.tasks.get(self._own_task(_require_id(opened.task_id, "open.task_id")))
        if not opened.argv and not task.spec.pty:
            raise ValidationError("open.argv", f"task {task.id} was started without --pty: it has no terminal to "
                                               "attach to (gptrmctl logs -f shows its output)")
        principal = current_principal()
        async for out in self._app.sessions.run(task, opened, request_iterator,
                                                principal.name if principal is not None else ""):
            yield out


def _stored_view(record: types_pb2.NodeRecord) -> admin_pb2.NodeView:
    """A node as a standby shows it: its stored record, in the state that record says (``stored_state``)."""
    return admin_pb2.NodeView(record=record, state=pb_enum(types_pb2.NodeState, stored_state(record)))


def _with_mode(policy: types_pb2.Policy) -> types_pb2.Policy:
    """The policy with its threshold mode spelt out (a record from before modes has none: the default)."""
    if policy.threshold_mode:
        return policy
    shown = types_pb2.Policy()
    shown.CopyFrom(policy)
    shown.threshold_mode = threshold_mode(policy)
    return shown


def _event_pb(e: Event) -> admin_pb2.Event:
    return admin_pb2.Event(seq=e.seq, time_unix_s=e.time_unix_s,
                           kind=pb_enum(admin_pb2.EventKind, _EVENT_KINDS.get(e.kind, 0)),
                           node_id=e.node_id, task_id=e.task_id, message=e.message, fields=e.fields)
