"""What the web console reads, through the Admin servicer's own methods, in process.

The console never reads the replica's tables itself: every page calls the same
:class:`~coordinator.api.admin.AdminService` method ``gptrmctl`` calls over gRPC, as the signed-in
principal (:func:`~coordinator.api.auth.acting_as`), so one implementation decides what a replica answers
(a standby reads etcd, :data:`~coordinator.api.admin.SERVED_BY`), what a role may call
(:func:`~coordinator.api.auth.required_role`) and what it may read of the answer (the servicer's redaction
of secret fields, :mod:`coordinator.api.tenancy`).

The servicer reports a refusal by aborting its gRPC context; here the context is :class:`_Context`, whose
``abort`` raises :class:`WebRefused` with the status code and message the gRPC caller would get.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from common.errors import GptrmError, PermissionDenied
from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.api.admin import AdminService
from coordinator.api.auth import ADMIN_SERVICE, Principal, acting_as, required_role
from coordinator.rpc_metadata import LEADER_METADATA_KEY

__all__ = ["Reader", "WebRefused"]

R = TypeVar("R")
_PAGE = 1000


class WebRefused(GptrmError):
    """An Admin method refused the console's call: ``code`` is the gRPC status it answered with.

    :param leader_address: the leader's address when a standby refused a leader-only call."""

    def __init__(self, code: grpc.StatusCode, message: str, leader_address: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.leader_address = leader_address

    @property
    def http_status(self) -> int:
        """The HTTP status a page answers this refusal with."""
        return {grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.PERMISSION_DENIED: 403,
                grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.INVALID_ARGUMENT: 400,
                grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.FAILED_PRECONDITION: 409}.get(self.code, 500)


class _Context:
    """The part of a gRPC servicer context the Admin methods use, for an in-process call."""

    def __init__(self) -> None:
        self.trailing: dict[str, str] = {}

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing.update((str(k), str(v)) for k, v in metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise WebRefused(code, details, self.trailing.get(LEADER_METADATA_KEY, ""))

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def done(self) -> bool:
        return False


def _check_role(principal: Principal, method: str) -> None:
    needed = required_role(f"/{ADMIN_SERVICE}/{method}")
    if needed is not None and needed != "any" and not principal.at_least(needed):
        raise WebRefused(grpc.StatusCode.PERMISSION_DENIED, f"{method} needs role {needed}; {principal.name!r} is "
                         f"{principal.role}")


class Reader:
    """The Admin reads the console makes, each as a given principal.

    :param admin: the replica's Admin servicer (the one the gRPC server serves).
    """

    def __init__(self, admin: AdminService) -> None:
        self.admin = admin

    async def call(self, principal: Principal, method: str, request: Any) -> Any:
        """``AdminService.<method>(request)`` as ``principal``.

        :raises WebRefused: the role may not call it, or the method refused (its gRPC status and message).
        """
        _check_role(principal, method)
        fn: Callable[[Any, Any], Awaitable[Any]] = getattr(self.admin, method)
        with acting_as(principal):
            try:
                return await fn(request, _Context())
            except PermissionDenied as e:   # raised past the servicer: the gRPC interceptor's to answer
                raise WebRefused(grpc.StatusCode.PERMISSION_DENIED, str(e)) from None

    async def stream(self, principal: Principal, method: str, request: Any) -> AsyncIterator[Any]:
        """The items of the streaming ``AdminService.<method>(request)`` as ``principal``.

        :raises WebRefused: as :meth:`call`.
        """
        _check_role(principal, method)
        with acting_as(principal):
            try:
                async for item in getattr(self.admin, method)(request, _Context()):
                    yield item
            except PermissionDenied as e:
                raise WebRefused(grpc.StatusCode.PERMISSION_DENIED, str(e)) from None

    # ---- the reads the pages make ----------------------------------------------------------------

    async def status(self, p: Principal) -> admin_pb2.ClusterStatus:
        return await self.call(p, "GetStatus", admin_pb2.GetStatusRequest())

    async def nodes(self, p: Principal) -> tuple[list[admin_pb2.NodeView], bool]:
        """Every node, as ListNodes answers it but in one piece, and whether the answer is stale."""
        _check_role(p, "ListNodes")
        with acting_as(p):
            return await self.admin.node_views()

    async def tasks(self, p: Principal, states: list[Any] | None = None) -> tuple[list[types_pb2.Task], bool]:
        """Every task (in ``states``, when given), oldest first, and whether the answer is stale."""
        out: list[types_pb2.Task] = []
        token, stale = "", False
        while True:
            page = await self.call(p, "ListTasks", admin_pb2.ListTasksRequest(states=states or [], page_size=_PAGE,
                                                                             page_token=token))
            out.extend(page.tasks)
            stale = stale or page.stale
            token = page.next_page_token
            if not token:
                return out, stale

    async def task(self, p: Principal, task_id: str) -> types_pb2.Task:
        return await self.call(p, "GetTask", admin_pb2.GetTaskRequest(task_id=task_id))

    async def node(self, p: Principal, node_id: str) -> admin_pb2.NodeView:
        return await self.call(p, "GetNode", admin_pb2.GetNodeRequest(node_id=node_id))

    async def queues(self, p: Principal) -> admin_pb2.ListQueuesResponse:
        return await self.call(p, "ListQueues", admin_pb2.ListQueuesRequest())

    async def usage(self, p: Principal, since_unix_s: float, by: str = "queue") -> admin_pb2.UsageReport:
        return await self.call(p, "GetUsage", admin_pb2.UsageRequest(since_unix_s=since_unix_s, by=by))

    async def service(self, p: Principal, service_id: str) -> admin_pb2.ServiceView:
        return await self.call(p, "GetService", admin_pb2.ServiceRef(service_id=service_id))

    def events(self, p: Principal, backlog: int, follow: bool) -> AsyncIterator[admin_pb2.Event]:
        return self.stream(p, "StreamEvents", admin_pb2.StreamEventsRequest(backlog=backlog, follow=follow))

    def logs(self, p: Principal, task_id: str, tail_lines: int) -> AsyncIterator[admin_pb2.TaskLogChunk]:
        return self.stream(p, "TaskLogs", admin_pb2.TaskLogsRequest(task_id=task_id, tail_lines=tail_lines,
                                                                    follow=True))


class Shared:
    """One computation of ``fn`` per ``ttl_s``, shared by every browser that asks meanwhile (a page's
    live stream recomputes its model once per tick for all its viewers, not once per viewer)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._cache: dict[Any, tuple[float, Any]] = {}
        self._running: dict[Any, asyncio.Future[Any]] = {}
        self._cost: dict[Any, float] = {}

    async def get(self, key: Any, fn: Callable[[], Awaitable[R]], ttl_s: float | None = None) -> R:
        """``fn()``'s value for ``key``: computed at most once per ``ttl_s`` (default: the instance's), and
        once for every caller that asks while it is being computed."""
        hit = self._cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < (self.ttl_s if ttl_s is None else ttl_s):
            return hit[1]
        running = self._running.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        started = time.monotonic()
        try:
            value = await fn()
        except Exception as e:
            future.set_exception(e)
            future.exception()   # marked retrieved: the waiters re-raise it
            raise
        except BaseException:
            future.cancel()
            raise
        else:
            future.set_result(value)
        finally:
            del self._running[key]
        if len(self._cache) > 256:
            self._cache.clear()
        self._cost[key] = time.monotonic() - started
        self._cache[key] = (time.monotonic(), value)
        return value

    def cost_s(self, key: Any) -> float:
        """What computing ``key``'s value last took, in seconds (0 before the first)."""
        return self._cost.get(key, 0.0)
