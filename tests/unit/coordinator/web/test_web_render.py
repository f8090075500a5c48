"""The web console's HTML: hostile values are shown as text, pages carry no inline script or style, and the
fleet grid's colours follow the measures."""

from __future__ import annotations

from html.parser import HTMLParser

from common.pb.gptrm.v1 import admin_pb2, types_pb2
from coordinator.web import render
from coordinator.web.html import Html, esc, tag, url

HOSTILE = "<script>alert(1)</script>\"' onmouseover=x &amp;"
ASSETS = {n: f"/static/{n}?v=1" for n in ("app.css", "app.js", "uPlot.iife.min.js", "uPlot.min.css")}
VIEWER = render.Viewer(HOSTILE, "viewer", True, banner=HOSTILE)


def _no_markup_from(text: str, page: str) -> None:
    assert "<script>alert" not in page
    assert esc(text) in page


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {k for k, _ in attrs}
        if (tag == "script" and "src" not in names) or tag == "style":
            self.found.append(f"<{tag}> inline")
        self.found += [f"{tag} {k}=" for k in names if k == "style" or k.startswith("on")]
        self.found += [f"{tag} {k}={v}" for k, v in attrs
                       if k in ("href", "src") and (v or "").startswith("javascript")]


def _inline_code(page: str) -> list[str]:
    """Inline scripts and styles, style and event-handler attributes, javascript: URLs: what the page's
    parsed elements hold (text that merely reads like markup is not an element)."""
    parser = _Elements()
    parser.feed(page)
    return parser.found


def _task(name: str = HOSTILE) -> types_pb2.Task:
    t = types_pb2.Task(id="t-1", state=types_pb2.TASK_STATE_RUNNING, queue="a", submitted_by=HOSTILE, reason=HOSTILE,
                       log_tail=f"line {HOSTILE}\n")
    t.spec.name = name
    t.spec.argv.extend(["sh", "-c", HOSTILE])
    t.history.add(state=types_pb2.TASK_STATE_PENDING, time_unix_s=1.7e9, reason=HOSTILE)
    t.parts.add(node_id=HOSTILE, rank=0, state=types_pb2.TASK_STATE_RUNNING)
    t.allocation.nodes.add(node_id=HOSTILE, gpu_indices=[0, 1])
    return t


def test_escaping_helpers() -> None:
    assert esc(HOSTILE) == "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#x27; onmouseover=x &amp;amp;"
    assert esc(Html("<b>")) == "<b>"
    assert tag("a", HOSTILE, href=HOSTILE, cls="x") == (f'<a href="{esc(HOSTILE)}" class="x">{esc(HOSTILE)}</a>')
    assert url("/tasks", "t/../x?y") == "/tasks/t%2F..%2Fx%3Fy"
    assert url("/", color="util", only="", group="a&b=c") == "/?color=util&group=a%26b%3Dc"


def test_tasks_list_and_task_page_show_hostile_values_as_text() -> None:
    t = _task()
    rows = [render.task_row(t)]
    page = render.page("Tasks", "tasks", VIEWER, render.tasks_body(rows, 1, {"state": "", "queue": HOSTILE,
                                                                              "user": "", "node": ""}),
                       live=url("/live/tasks", queue=HOSTILE), assets=ASSETS)
    _no_markup_from(HOSTILE, page)
    assert not _inline_code(page), _inline_code(page)
    history = {HOSTILE: {"t": [1.7e9, 1.7e9 + 1], "gpus": {"0": [10.0, None]}}}
    detail = render.page("Task", "task", VIEWER, render.task_body(t, [(HOSTILE, 0, "50%")], logs_shown=True,
                                                                  log_note="", util_history=history), assets=ASSETS)
    _no_markup_from(HOSTILE, detail)
    assert not _inline_code(detail)
    assert f'<pre id="log" class="log">line {esc(HOSTILE)}' in detail
    assert 'class="chart util-chart" data-points="{&quot;t&quot;: [1700000000.0' in detail


def test_task_page_without_log_rights_shows_why_and_no_log() -> None:
    t = _task("plain")
    page = render.task_body(t, [], logs_shown=False, log_note="Logs are hidden: role viewer may not read task output.")
    assert 'id="log-hidden"' in page and 'id="log"' not in page and "line " not in page


def test_other_pages_escape_and_hold_no_inline_code() -> None:
    q = admin_pb2.QueueView(running=1, pending=2, fair_order=1)
    q.queue.name = HOSTILE
    q.queue.quotas.add(gpu_model="*", gpus=4)
    q.held.add(gpu_model="*", own=2, borrowed=1)
    queues = render.queues_body(admin_pb2.ListQueuesResponse(queues=[q], managed=True), [render.queue_row(q, 3.5)])
    svc = admin_pb2.ServiceView()
    svc.service.id = HOSTILE
    svc.service.spec.name = HOSTILE
    ev = admin_pb2.Event(seq=3, time_unix_s=1.7e9, message=HOSTILE, node_id=HOSTILE, task_id=HOSTILE)
    node = admin_pb2.NodeView(state=types_pb2.NODE_STATE_READY)
    node.record.inventory.node_id = HOSTILE
    node.record.inventory.labels["rack"] = HOSTILE
    node.record.inventory.gpus.add(index=0)
    summary = render.FleetSummary(1, {"NODE_STATE_READY": 1}, 1, 1, 100.0, 0.0, 0)
    fleet = render.fleet_body([render.fleet_node(node, "util", "rack")], summary, color="util", group=HOSTILE,
                              only=None)
    for active, body in (("queues", queues), ("services", render.services_body([render.service_row(svc)])),
                         ("events", render.events_body([render.event_row(ev)])), ("fleet", fleet)):
        page = render.page(active, active, VIEWER, body, assets=ASSETS)
        _no_markup_from(HOSTILE, page)
        assert not _inline_code(page), (active, _inline_code(page))
    signin = render.signin_page(HOSTILE, ASSETS)
    _no_markup_from(HOSTILE, signin)
    assert 'type="password"' in signin and not _inline_code(signin)


def _gpu_node(**sample: object) -> admin_pb2.NodeView:
    node = admin_pb2.NodeView(state=types_pb2.NODE_STATE_READY, has_latest=True)
    node.record.inventory.node_id = "n1"
    node.record.inventory.gpus.add(index=0, mem_total_bytes=100, power_limit_w=400)
    node.record.inventory.gpus.add(index=1)
    node.latest.gpus.add(index=0, healthy=True, **sample)
    return node


def test_fleet_cells_colour_by_measure_health_and_power_state() -> None:
    node = _gpu_node(util_gpu=0.55, mem_used_bytes=95, power_w=40.0)
    assert render.fleet_cells(node, "util") == "5x"   # GPU 1 reports nothing
    assert render.fleet_cells(node, "mem") == "9x"
    assert render.fleet_cells(node, "power") == "1x"
    assert render.fleet_cells(node, "health") == "0x"
    sick = _gpu_node(util_gpu=0.1)
    sick.latest.gpus[0].health.state = types_pb2.GPU_HEALTH_STATE_UNHEALTHY
    assert render.fleet_cells(sick, "util") == "ux"
    slow = _gpu_node(util_gpu=0.1)
    slow.latest.gpus[0].health.state = types_pb2.GPU_HEALTH_STATE_DEGRADED
    assert render.fleet_cells(slow, "health") == "dx" and render.fleet_cells(slow, "util") == "1x"
    node.record.power_state = types_pb2.NODE_POWER_STATE_OFF
    assert render.fleet_cells(node, "util") == "oo"


def test_fleet_groups_by_label_and_zooms_into_one() -> None:
    nodes = [{"id": f"n{i}", "group": "r1" if i < 2 else "", "state": "ready", "cells": "01"} for i in range(3)]
    summary = render.FleetSummary(3, {}, 6, 6, 0.0, 0.0, 0)
    body = render.fleet_body(nodes, summary, color="util", group="rack", only=None)
    assert body.count('<section class="grp">') == 2 and "no rack label" in body
    zoomed = render.fleet_body(nodes, summary, color="util", group="rack", only="r1")
    assert zoomed.count('<section class="grp">') == 1 and 'class="grid zoom"' in zoomed
    assert 'id="n:n2"' not in zoomed


def _element(array_id: str, index: int, state: int, submit: float) -> types_pb2.Task:
    t = types_pb2.Task(id=f"{array_id}_{index}", array_id=array_id, array_index=index, state=state,
                       submit_unix_s=submit, queue="team")
    t.spec.name = "sweep"
    t.spec.array.max_running = 2
    return t


def test_an_array_is_one_row_at_its_newest_elements_place() -> None:
    """The rows are newest first; an array's elements make one row where its newest element would be, its state
    that of its least advanced elements (running before pending, a failure before a success), its counts by state
    as the reason. Without grouping every element is a row."""
    plain = types_pb2.Task(id="t-1", state=types_pb2.TASK_STATE_PENDING, submit_unix_s=2.0)
    late = types_pb2.Task(id="t-2", state=types_pb2.TASK_STATE_RUNNING, submit_unix_s=9.0)
    a = [_element("a-1", i, s, 1.0 + i) for i, s in enumerate(
        (types_pb2.TASK_STATE_SUCCEEDED, types_pb2.TASK_STATE_RUNNING, types_pb2.TASK_STATE_PENDING,
         types_pb2.TASK_STATE_PENDING))]
    tasks = sorted([plain, late, *a], key=lambda t: t.submit_unix_s)
    rows = render.task_rows(tasks)
    assert [r["id"] for r in rows] == ["t-2", "a-1", "t-1"]
    assert rows[1]["state"] == "running" and rows[1]["name"] == "sweep"
    assert rows[1]["reason"] == "array of 4 (%2): 2 pending, 1 running, 1 succeeded"
    ended = [_element("a-2", i, s, 1.0) for i, s in enumerate(
        (types_pb2.TASK_STATE_SUCCEEDED, types_pb2.TASK_STATE_FAILED))]
    assert render.array_row("a-2", ended)["state"] == "failed"
    assert [r["id"] for r in render.task_rows(tasks, arrays=False)][:3] == ["t-2", "a-1_3", "a-1_2"]
