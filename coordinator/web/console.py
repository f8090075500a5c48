"""The web console's HTTP server (``--web-listen``): read-only pages over the Admin servicer, for browsers.

Served by aiohttp on the coordinator's own event loop (the loop grpc.aio serves on), so a page reads the
replica's memory in process, with no extra thread or hop: :class:`~coordinator.web.reader.Reader` calls the
Admin servicer's methods as the browser's principal (:mod:`coordinator.web.sessions`).

The HTTP boundary gets the gRPC boundary's treatment:

- sizes: request bodies at most :data:`MAX_BODY` (the sign-in form is the only body), request lines and
  headers at most :data:`MAX_LINE` each, at most :data:`MAX_STREAMS` live streams at once
  (:data:`MAX_STREAMS_EACH` per signed-in person), ten refused sign-ins a minute per address;
- time: idle keep-alive connections close after :data:`KEEPALIVE_S`; a stream sends a comment every
  :data:`HEARTBEAT_S` so a vanished browser is noticed;
- headers on every answer: a strict Content-Security-Policy (:data:`CSP`: scripts and styles from this
  server only, nothing inline, no frames, no other origin), ``nosniff``, no referrer to another origin
  (same-origin: so a form post carries its Origin), ``no-store`` for
  everything but the versioned static files;
- a POST (sign-in, sign-out) must come from this origin (its ``Origin`` header), besides the cookie's
  SameSite=Strict;
- every value on a page is escaped (:mod:`coordinator.web.html`); the live streams send JSON that the
  script writes as text.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gzip
import hashlib
import ipaddress
import math
import socket
import ssl
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import grpc
from aiohttp import web

from common.errors import GptrmError
from common.logging import get_logger
from common.pb.gptrm.v1 import types_pb2
from coordinator.adaptor.forecast import HistorySnapshot
from coordinator.api.admin import AdminService
from coordinator.api.auth import SUBMITTER, Principal, Security
from coordinator.api.tenancy import covers, usage_filter
from coordinator.monitor.resources import NodeHistory
from coordinator.profiler.workflow_spec import is_array_id
from coordinator.queues import QueueConfig
from coordinator.web import render
from coordinator.web.html import Html, url
from coordinator.web.live import Baselines, sse_event, ticking
from coordinator.web.reader import Reader, Shared, WebRefused
from coordinator.web.sessions import COOKIE, MAX_AGE_S, Sessions, SignInRefused

__all__ = ["CSP", "WebConsole"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
MAX_BODY = 16 * 1024
MAX_LINE = 8 * 1024
MAX_STREAMS = 256
MAX_STREAMS_EACH = 32
KEEPALIVE_S = 30.0
HEARTBEAT_S = 15.0
LOG_TAIL_LINES = 200
LOG_LINE_MAX = 4096
STATIC = ("app.css", "app.js", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE")
_CHART_POINTS = 360
_HISTORY_NODES = 4
_HISTORY_POINTS = 300
_log = get_logger("web")
_INVALID = grpc.StatusCode.INVALID_ARGUMENT


class _Asset:
    def __init__(self, name: str, body: bytes) -> None:
        self.name = name
        self.body = body
        self.gzipped = gzip.compress(body, 9, mtime=0)
        self.version = hashlib.sha256(body).hexdigest()[:12]
        self.type = {"css": "text/css", "js": "text/javascript"}.get(name.rsplit(".", 1)[-1], "text/plain")


def _load_assets() -> dict[str, _Asset]:
    root = resources.files("coordinator.web") / "static"
    return {name: _Asset(name, (root / name).read_bytes()) for name in STATIC}


def _filters(request: web.Request, *names: str) -> dict[str, str]:
    return {n: request.query.get(n, "")[:253] for n in names}


class WebConsole:
    """The console of one coordinator replica.

    :param admin: the replica's Admin servicer (every read goes through it).
    :param security: the replica's TLS, authenticator and audit log.
    :param listen: ``HOST:PORT`` to serve on.
    :param queue_config: the replica's queue tree now (who covers a task's queue may read its log).
    :param gpu_history: a node's telemetry history in the replica's resource monitor (the leader's: agents
        report to it), for a task's GPU utilization over its life; None: no such charts.
    :param load_history: a service's load history in the replica's service controller (the leader's), to start
        its load chart with; None: the chart starts when the console first reads the service.
    """

    def __init__(self, admin: AdminService, security: Security, listen: str,
                 queue_config: Callable[[], QueueConfig],
                 gpu_history: Callable[[str], NodeHistory | None] | None = None,
                 load_history: Callable[[str], HistorySnapshot | None] | None = None) -> None:
        self.reader = Reader(admin)
        self.queue_config = queue_config
        self.gpu_history = gpu_history
        self.load_history = load_history
        self.security = security
        self.sessions = Sessions(security.authn, security.audit)
        self.listen = listen
        self.assets = _load_assets()
        self.urls = {name: f"/static/{name}?v={a.version}" for name, a in self.assets.items()}
        self.shared = Shared(ttl_s=1.0)
        self.baselines = Baselines()
        self.streams = 0
        self._streams_of: collections.Counter[str] = collections.Counter()
        self.charts: dict[str, list[list[float | None]]] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- serving ------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._guard])
        app.add_routes([
            web.get("/", self.fleet), web.get("/queues", self.queues), web.get("/tasks", self.tasks),
            web.get("/tasks/{task_id}", self.task), web.get("/services", self.services),
            web.get("/events", self.events), web.get("/signin", self.signin_form), web.post("/signin", self.signin),
            web.post("/signout", self.signout), web.get("/static/{name}", self.static),
            web.get("/live/fleet", self.live_fleet), web.get("/live/tasks", self.live_tasks),
            web.get("/live/tasks/{task_id}", self.live_task), web.get("/live/queues", self.live_queues),
            web.get("/live/services", self.live_services), web.get("/live/events", self.live_events),
        ])
        return app

    def _ssl(self) -> ssl.SSLContext | None:
        """HTTPS with the coordinator's server certificate where it uses TLS, asking (not requiring) a client
        certificate from the same CA: a browser without one signs in with a token."""
        tls = self.security.server_tls
        if tls is None:
            return None
        files = tls.files
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=files.ca)
        ctx.load_cert_chain(files.cert, files.key)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    async def start(self) -> int:
        """Serve on :attr:`listen`; returns the port bound.

        :raises GptrmError: the address cannot be bound."""
        host, _, port = self.listen.rpartition(":")
        self._runner = web.AppRunner(self.app(), access_log=None, keepalive_timeout=KEEPALIVE_S, shutdown_timeout=2.0,
                                     handler_cancellation=True, max_line_size=MAX_LINE, max_field_size=MAX_LINE)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host.strip("[]"), int(port), ssl_context=self._ssl(), backlog=128)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            raise GptrmError(f"--web-listen {self.listen}: cannot bind ({e.strerror})") from None
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else int(port)
        _log.info("web_console_started", listen=self.listen, port=self.port, tls=self.security.server_tls is not None,
                  auth="none" if self.sessions.open else self.security.authn.mode)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- the boundary -------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                     ) -> web.StreamResponse:
        try:
            if self.sessions.open and not local_host_name(request.host):
                # Open mode: a page of another site whose name was re-pointed at this address (DNS rebinding)
                # would read the console as its own origin; such a request names that site in Host.
                raise web.HTTPMisdirectedRequest(text="open console: address it by IP address, localhost or this "
                                                 "host's name")
            if request.method == "POST" and not self._same_origin(request):
                raise web.HTTPForbidden(text="cross-origin form refused")
            if request.path.startswith("/static/") or request.path == "/signin":
                response = await handler(request)
            else:
                principal = self._principal(request)
                if principal is None:
                    if request.path.startswith("/live/"):
                        raise web.HTTPUnauthorized(text="sign in first")
                    raise web.HTTPSeeOther("/signin")
                request["principal"] = principal
                response = await handler(request)
        except SignInRefused as e:
            response = self._html(render.signin_page(str(e), self.urls), status=403)
        except WebRefused as e:
            response = self._error(request, e.http_status, str(e))
        except web.HTTPException as e:
            response = e
        except Exception as e:
            # A bug: the browser gets an id to quote, the log the traceback; no internal detail leaks.
            correlation_id = uuid.uuid4().hex[:12]
            _log.exception("web_request_failed", path=request.path, correlation_id=correlation_id,
                           reason=type(e).__name__)
            response = self._error(request, 500, f"internal error (correlation id {correlation_id}; the "
                                   "coordinator's log has the details)")
        for k, v in (("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff"),
                     ("Referrer-Policy", "same-origin"), ("X-Frame-Options", "DENY"),
                     ("Cross-Origin-Opener-Policy", "same-origin")):
            response.headers.setdefault(k, v)
        if not request.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    def _same_origin(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        return origin is None or origin == f"{request.scheme}://{request.host}"

    def _peer_pem(self, request: web.Request) -> bytes | None:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        return ssl.DER_cert_to_PEM_cert(der).encode() if der else None

    def _principal(self, request: web.Request) -> Principal | None:
        return self.sessions.principal(request.cookies.get(COOKIE), self._peer_pem(request))

    def _viewer(self, request: web.Request, status: Any = None) -> render.Viewer:
        p: Principal = request["principal"]
        banner = ""
        if status is not None and not status.is_leader:
            banner = (f"Standby {status.coordinator_id}: showing what etcd holds now (leader: "
                      f"{status.leader_id or 'none known'}).")
        if status is not None and status.stale:
            banner = f"{status.coordinator_id} cannot reach etcd: showing its own memory, which may be out of date."
        return render.Viewer(p.name, p.role, p.via == "token", banner)

    def _html(self, body: str, status: int = 200) -> web.Response:
        response = web.Response(text=body, status=status, content_type="text/html", charset="utf-8")
        response.enable_compression()
        return response

    def _error(self, request: web.Request, status: int, message: str) -> web.Response:
        p = request.get("principal")
        viewer = render.Viewer(p.name, p.role, p.via == "token") if p else render.Viewer("", "", False)
        return self._html(render.page("Error", "", viewer, render.error_body(message), assets=self.urls), status)

    def _page(self, request: web.Request, title: str, active: str, body: Html, status: Any, live: str = "",
              ) -> web.Response:
        return self._html(render.page(title, active, self._viewer(request, status), body, live=live,
                                      assets=self.urls))

    # ---- sign-in ------------------------------------------------------------------------------------

    async def signin_form(self, request: web.Request) -> web.StreamResponse:
        if self.sessions.open:
            raise web.HTTPSeeOther("/")
        return self._html(render.signin_page("", self.urls))

    async def signin(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        token = str(form.get("token", ""))
        peer = request.remote or ""
        try:
            sid, _ = self.sessions.sign_in(token, peer)
        except SignInRefused as e:
            return self._html(render.signin_page(str(e), self.urls), status=403)
        response = web.HTTPSeeOther("/")
        response.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", secure=request.secure, path="/",
                            max_age=int(MAX_AGE_S))
        return response

    async def signout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.sign_out(request.cookies.get(COOKIE, ""))
        response = web.HTTPSeeOther("/signin")
        response.del_cookie(COOKIE, path="/")
        return response

    async def static(self, request: web.Request) -> web.StreamResponse:
        asset = self.assets.get(request.match_info["name"])
        if asset is None:
            raise web.HTTPNotFound()
        gz = "gzip" in request.headers.get("Accept-Encoding", "")
        response = web.Response(body=asset.gzipped if gz else asset.body, content_type=asset.type)
        if gz:
            response.headers["Content-Encoding"] = "gzip"
        response.headers["Vary"] = "Accept-Encoding"
        response.headers["Cache-Control"] = ("public, max-age=31536000, immutable"
                                             if request.query.get("v") == asset.version else "no-cache")
        return response

    # ---- fleet --------------------------------------------------------------------------------------

    def _fleet_params(self, request: web.Request) -> tuple[str, str, str | None]:
        color = request.query.get("color", "util")
        if color not in render.COLORS:
            raise WebRefused(_INVALID, f"color: must be one of {', '.join(render.COLORS)}")
        group = request.query.get("group", "rack")[:63]
        only = request.query.get("only")
        return color, group, only[:253] if only is not None else None

    def _usage_scope(self, p: Principal) -> Any:
        """Whose usage ``p`` reads: ``"all"`` (a cluster admin, a viewer) or its own queues' (a team role)."""
        return "all" if usage_filter(p, self.queue_config()) is None else (p.name, p.role, p.queues)

    async def _fleet_model(self, p: Principal, color: str, group: str) -> tuple[dict[str, Any], dict[str, Any]]:
        # Nodes hold no secrets: one model for every browser, except that the energy figure is the usage this
        # principal may read (a team role reads its own queues' only, as GetUsage answers it).
        scope = self._usage_scope(p)

        async def compute() -> tuple[dict[str, Any], dict[str, Any]]:
            status = await self.reader.status(p)
            views, _ = await self.reader.nodes(p)
            energy = await self.shared.get(("energy-today", scope), lambda: self._energy_today(p), ttl_s=60.0)
            rows = {}
            down = 0
            for v in views:
                row = render.fleet_node(v, color, group)
                rows[row["id"]] = row
                down += v.record.power_state in (types_pb2.NODE_POWER_STATE_OFF,
                                                 types_pb2.NODE_POWER_STATE_POWERING_OFF)
            summary = render.FleetSummary(
                nodes=len(views), nodes_by_state={c.key: c.count for c in status.nodes_by_state},
                gpus=status.gpus_total, gpus_idle=max(0, status.gpus_total - status.gpus_allocated),
                power_w=status.objectives.power_w, energy_today_kwh=energy, powered_down=down)
            return rows, {"summary": dict(summary.items()), "obj": summary}
        return await self.shared.get(("fleet", color, group, scope), compute)

    async def _energy_today(self, p: Principal) -> float:
        midnight = math.floor(time.time() / 86400) * 86400
        try:
            report = await self.reader.usage(p, midnight)
        except WebRefused:
            return 0.0
        return sum(r.energy_kwh for r in report.rows)

    async def fleet(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        color, group, only = self._fleet_params(request)
        rows, extra = await self._fleet_model(p, color, group)
        status = await self.reader.status(p)
        vid = self.baselines.keep(rows)
        body = render.fleet_body(list(rows.values()), extra["obj"], color=color, group=group, only=only)
        return self._page(request, "Fleet", "fleet", body, status,
                          live=url("/live/fleet", color=color, group=group, v=vid))

    async def live_fleet(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        color, group, _ = self._fleet_params(request)

        async def compute() -> tuple[dict[str, Any], dict[str, Any]]:
            rows, extra = await self._fleet_model(p, color, group)
            return ({k: r["cells"] + " " + r["state"] for k, r in rows.items()}, {"summary": extra["summary"]})
        rendered = self.baselines.take(request.query.get("v", ""))
        baseline = {k: r["cells"] + " " + r["state"] for k, r in rendered.items()}
        key = ("fleet", color, group, self._usage_scope(p))
        return await self._stream(request, ticking(compute, baseline, 2.0, lambda: self.shared.cost_s(key)))

    # ---- tasks --------------------------------------------------------------------------------------

    async def _task_rows(self, p: Principal, f: dict[str, str]) -> tuple[dict[str, Any], int]:
        key = ("tasks", p.name, p.role, p.queues)
        tasks, _ = await self.shared.get(key, lambda: self.reader.tasks(p))
        matching = [t for t in tasks if render.task_matches(t, **f)]
        # An array is one line, except on the list of its own elements.
        return render.as_dict(render.task_rows(matching, arrays=not f["array"])), len(matching)

    async def tasks(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        f = _filters(request, "state", "queue", "user", "node", "array")
        rows, total = await self._task_rows(p, f)
        status = await self.reader.status(p)
        vid = self.baselines.keep(rows)
        return self._page(request, "Tasks", "tasks", render.tasks_body(list(rows.values()), total, f), status,
                          live=url("/live/tasks", **f, v=vid))

    async def live_tasks(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        f = _filters(request, "state", "queue", "user", "node", "array")

        async def compute() -> tuple[dict[str, Any], dict[str, Any]]:
            rows, _ = await self._task_rows(p, f)
            return rows, {}
        return await self._stream(request, ticking(compute, self.baselines.take(request.query.get("v", "")), 1.0))

    def _logs_allowed(self, p: Principal, task: types_pb2.Task) -> tuple[bool, str]:
        """Whether ``p`` may read the task's output (as TaskLogs decides: a team role covering its queue)."""
        if not p.at_least(SUBMITTER):
            return False, f"Logs are hidden: role {p.role} may not read task output."
        if not covers(p, self.queue_config(), task.queue):
            return False, f"Logs are hidden: {p.name} does not cover queue {task.queue or 'default'}."
        return True, ""

    async def _task_gpus(self, p: Principal, t: types_pb2.Task) -> list[tuple[str, int, str]]:
        out = []
        for a in list(t.allocation.nodes)[:16]:
            try:
                view = await self.reader.node(p, a.node_id)
            except WebRefused:
                view = None
            samples = {g.index: g for g in view.latest.gpus} if view is not None and view.has_latest else {}
            for i in a.gpu_indices:
                s = samples.get(i)
                util = f"{s.util_gpu * 100:.0f}%" if s is not None and s.HasField("util_gpu") else "?"
                out.append((a.node_id, i, util))
        return out

    def _util_history(self, t: types_pb2.Task) -> dict[str, dict[str, Any]]:
        """Per node of the task (the first :data:`_HISTORY_NODES`), its GPUs' utilization (%) since the task
        was placed, as far back as the resource monitor keeps: ``{node: {"t": [...], "gpus": {index: [...]}}}``,
        at most :data:`_HISTORY_POINTS` points each."""
        if self.gpu_history is None:
            return {}
        start = t.allocation.created_unix_s or t.submit_unix_s
        out: dict[str, dict[str, Any]] = {}
        for a in list(t.allocation.nodes)[:_HISTORY_NODES]:
            history = self.gpu_history(a.node_id)
            if history is None:
                continue
            times: list[float] = []
            gpus: dict[str, list[float | None]] = {}
            for i in list(a.gpu_indices)[:16]:
                try:
                    ts, vs = history.series("util_gpu", i)
                except IndexError:
                    continue
                keep = ts >= start
                ts, vs = ts[keep], vs[keep]
                step = max(1, -(-len(ts) // _HISTORY_POINTS))
                times = [round(float(x), 1) for x in ts[::step]]
                gpus[str(i)] = [None if math.isnan(v) else round(float(v) * 100, 1) for v in vs[::step]]
            if times:
                out[a.node_id] = {"t": times, "gpus": gpus}
        return out

    async def task(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        if is_array_id(request.match_info["task_id"]):   # an array's line links here: the list of its elements
            raise web.HTTPFound(url("/tasks", array=request.match_info["task_id"]))
        t = await self.reader.task(p, request.match_info["task_id"])
        allowed, note = self._logs_allowed(p, t)
        status = await self.reader.status(p)
        body = render.task_body(t, await self._task_gpus(p, t), logs_shown=allowed, log_note=note,
                                util_history=self._util_history(t))
        return self._page(request, f"Task {t.id}", "task", body, status,
                          live=url("/live/tasks", t.id, logs="1" if allowed and status.is_leader else ""))

    async def live_task(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        task_id = request.match_info["task_id"]
        first = await self.reader.task(p, task_id)
        want_logs = request.query.get("logs") == "1" and self._logs_allowed(p, first)[0]

        async def facts() -> tuple[dict[str, Any], dict[str, Any]]:
            t = await self.reader.task(p, task_id)
            history = {str(i): {"time": render.when(h.time_unix_s), "state": render.task_state(h.state),
                                "reason": h.reason} for i, h in enumerate(t.history)}
            parts = {str(x.rank): {"rank": str(x.rank), "node": x.node_id, "state": render.task_state(x.state),
                                   "exit": str(x.exit_code) if x.has_exit_code else "", "reason": x.reason}
                     for x in t.parts}
            return ({"facts": {"State": render.task_state(t.state), "Reason": t.reason or "-",
                               "Restarts": str(t.restarts), "Energy": f"{t.energy_j / 3.6e6:.3f} kWh",
                               "Exit code": str(t.exit_code) if t.has_exit_code else "-"},
                     "history": history, "parts": parts}, {})

        async def merged() -> AsyncIterator[tuple[str, Any]]:
            queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=256)

            async def pump_facts() -> None:
                async for d in ticking(facts, {}, 1.0):
                    await queue.put(("delta", d))

            async def pump_logs() -> None:
                try:
                    async for chunk in self.reader.logs(p, task_id, LOG_TAIL_LINES):
                        text = chunk.data.decode("utf-8", errors="replace")
                        await queue.put(("log", "\n".join(line[:LOG_LINE_MAX] for line in text.split("\n"))))
                except (WebRefused, GptrmError) as e:
                    await queue.put(("log-end", str(e)))
            pumps = [asyncio.create_task(pump_facts())] + ([asyncio.create_task(pump_logs())] if want_logs else [])
            try:
                while True:
                    yield await queue.get()
            finally:
                for t in pumps:
                    t.cancel()
        return await self._stream(request, merged(), named=True)

    # ---- queues -------------------------------------------------------------------------------------

    async def _queue_rows(self, p: Principal) -> tuple[dict[str, Any], Any]:
        views = await self.reader.queues(p)
        hours: dict[str, float] = {}
        with contextlib.suppress(WebRefused):
            report = await self.shared.get(("usage-week", p.name, p.role, p.queues),
                                           lambda: self.reader.usage(p, time.time() - 7 * 86400), ttl_s=60.0)
            hours = {r.key: r.gpu_hours for r in report.rows}
        rows = render.as_dict(render.queue_row(v, hours.get(v.queue.name, 0.0)) for v in views.queues)
        return rows, views

    async def queues(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        rows, views = await self._queue_rows(p)
        status = await self.reader.status(p)
        vid = self.baselines.keep(rows)
        return self._page(request, "Queues", "queues", render.queues_body(views, list(rows.values())), status,
                          live=url("/live/queues", v=vid))

    async def live_queues(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]

        async def compute() -> tuple[dict[str, Any], dict[str, Any]]:
            rows, _ = await self._queue_rows(p)
            return rows, {}
        return await self._stream(request, ticking(compute, self.baselines.take(request.query.get("v", "")), 3.0))

    # ---- services -----------------------------------------------------------------------------------

    async def _service_rows(self, p: Principal) -> dict[str, Any]:
        tasks, _ = await self.shared.get(("tasks", p.name, p.role, p.queues), lambda: self.reader.tasks(p))
        ids = sorted({t.service_id for t in tasks if t.service_id})
        rows = {}
        now = time.time()
        for sid in ids:
            try:
                view = await self.reader.service(p, sid)
            except WebRefused:
                continue
            rows[sid] = render.service_row(view)
            s = view.service
            if sid not in self.charts:
                self.charts[sid] = self._stored_load(sid)
            points = self.charts[sid]
            if not points or now - (points[-1][0] or 0.0) >= 5.0:
                points.append([round(now, 1), _finite(s.load), _finite(s.forecast_load)])
                del points[:-_CHART_POINTS]
        return rows

    def _stored_load(self, service_id: str) -> list[list[float | None]]:
        """The service's load history the leader keeps (a point per closed bucket, the last
        :data:`_CHART_POINTS`; no forecast: the controller keeps only the next one), to start its chart with."""
        snap = self.load_history(service_id) if self.load_history is not None else None
        if snap is None or not snap.values:
            return []
        values = snap.values[-_CHART_POINTS:]
        first = snap.last_bucket - len(values) + 1
        return [[(first + i) * snap.bucket_s, round(v, 3), None] for i, v in enumerate(values)]

    async def services(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        rows = await self.shared.get(("services", p.name, p.role, p.queues), lambda: self._service_rows(p))
        status = await self.reader.status(p)
        vid = self.baselines.keep(rows)
        return self._page(request, "Services", "services", render.services_body(list(rows.values())), status,
                          live=url("/live/services", v=vid))

    async def live_services(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]

        sent: dict[str, float] = {}   # per service, the time of the last chart point this browser has

        async def compute() -> tuple[dict[str, Any], dict[str, Any]]:
            rows = await self.shared.get(("services", p.name, p.role, p.queues), lambda: self._service_rows(p))
            new = {}
            for sid in rows:
                points = [pt for pt in self.charts.get(sid, []) if pt[0] is not None and pt[0] > sent.get(sid, 0.0)]
                if points:
                    new[sid] = points
                    sent[sid] = points[-1][0] or 0.0
            return rows, {"charts": new} if new else {}
        return await self._stream(request, ticking(compute, self.baselines.take(request.query.get("v", "")), 5.0))

    # ---- events -------------------------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        rows = [render.event_row(e) async for e in self.reader.events(p, 200, follow=False)][::-1]
        status = await self.reader.status(p)
        after = rows[0]["id"] if rows else "0"
        return self._page(request, "Events", "events", render.events_body(rows), status,
                          live=url("/live/events", after=after))

    async def live_events(self, request: web.Request) -> web.StreamResponse:
        p = request["principal"]
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            raise WebRefused(_INVALID, "after: must be an event number") from None

        async def follow() -> AsyncIterator[dict[str, Any]]:
            async for e in self.reader.events(p, 1000, follow=True):
                if e.seq > after:
                    row = render.event_row(e)
                    yield {"upsert": {row["id"]: row}, "remove": []}
        return await self._stream(request, follow())

    # ---- streams ------------------------------------------------------------------------------------

    async def _stream(self, request: web.Request, items: AsyncIterator[Any], *, named: bool = False,
                      ) -> web.StreamResponse:
        """Send ``items`` as server-sent events (``delta``, or ``(name, data)`` pairs when ``named``) until
        the browser goes away, with a comment every :data:`HEARTBEAT_S` of quiet. Gzipped when the browser
        accepts it, each event flushed whole (a fleet's delta is repetitive: ids and colour codes)."""
        who: Principal = request["principal"]
        if self.streams >= MAX_STREAMS or (self._streams_of[who.name] >= MAX_STREAMS_EACH and who.via != "none"):
            raise web.HTTPServiceUnavailable(text="too many live views open; close some, or try again later")
        self.streams += 1
        self._streams_of[who.name] += 1
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        gz = zlib.compressobj(6, zlib.DEFLATED, 31, 5) if "gzip" in request.headers.get("Accept-Encoding", "") \
            else None
        if gz is not None:
            headers["Content-Encoding"] = "gzip"
        response = web.StreamResponse(headers=headers)

        async def send(data: bytes) -> None:
            await response.write(data if gz is None else gz.compress(data) + gz.flush(zlib.Z_SYNC_FLUSH))
        it = aiter(items)
        next_item: asyncio.Future[Any] | None = None
        try:
            await response.prepare(request)
            while True:
                if next_item is None:
                    next_item = asyncio.ensure_future(anext(it))
                done, _ = await asyncio.wait({next_item}, timeout=HEARTBEAT_S)
                if not done:
                    await send(b": keep-alive\n\n")
                    continue
                item, next_item = next_item.result(), None
                name, data = item if named else ("delta", item)
                await send(sse_event(name, data))
        except (ConnectionResetError, StopAsyncIteration):
            pass
        except WebRefused as e:
            with contextlib.suppress(ConnectionResetError):
                await send(sse_event("refused", str(e)))
        finally:
            self.streams -= 1
            self._streams_of[who.name] -= 1
            if not self._streams_of[who.name]:
                del self._streams_of[who.name]
            if next_item is not None:
                next_item.cancel()
            with contextlib.suppress(Exception):
                await it.aclose()   # type: ignore[attr-defined]
        return response


def local_host_name(host: str) -> bool:
    """Whether a request's ``Host`` (``name[:port]``) names this machine: an IP address, ``localhost``, or this
    host's own name (what a browser sends when it was pointed at the console, not at another site)."""
    if host.startswith("["):   # [v6]:port
        name = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:   # name:port, v4:port
        name = host.split(":", 1)[0]
    else:
        name = host
    name = name.rstrip(".").lower()
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name in _own_names() or name.endswith(".localhost")


@functools.cache
def _own_names() -> frozenset[str]:
    """``localhost`` and this host's names (looked up once: the fully qualified name may ask DNS)."""
    return frozenset({"localhost", socket.gethostname().lower(), socket.getfqdn().lower()})


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
