"""The web console end to end: a real coordinator (``--web-listen``, ``--admin-tokens``, an audit log) with
one agent and etcd, read over HTTP and in the system's headless Chromium driven by Selenium.

Screenshots of every page go to the directory ``GPTRM_SCREENSHOTS`` names, when it is set.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import tempfile
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordinator.ctl.main import main as ctl_main
from coordinator.etcd_embedded import EtcdCluster
from coordinator.tokens import new_token, token_line
from tests.helpers.ports import free_port
from tests.integration.harness import ROOT_TASKS_AGENT, ROOT_TASKS_SUBMIT, Cluster, wait_until

HOSTILE = "<script>alert(1)</script>"
QUEUES = """
[[queue]]
name = "team"
gpus = { "*" = 2 }
default_for = ["root"]
[[queue]]
name = "lab"
gpus = { "*" = 1 }
budget = { kind = "gpu_hours", amount = 10, period = "day", action = "hold" }
"""
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@dataclass
class Console:
    cluster: Cluster
    web: str
    tokens: dict[str, str]
    audit: Path

    def ctl(self, *args: str) -> Any:
        res = self.cluster.ctl("--token", self.tokens["root"], "-o", "json", *args)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def request(self, method: str, path: str, body: dict[str, str] | None = None,
                headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        host, port = self.web.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        data = urllib.parse.urlencode(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={**({"Content-Type": "application/x-www-form-urlencoded"}
                                                          if data else {}), **(headers or {})})
        response = conn.getresponse()
        response.read()
        return response

    def audit_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit.read_text().splitlines()] if self.audit.exists() else []


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdCluster) -> Iterator[Console]:
    tmp = tmp_path_factory.mktemp("web")
    toks = {who: new_token() for who in ("root", "vera")}
    (tmp / "tokens").write_text(token_line("root", "admin", toks["root"]) + "\n"
                                + token_line("vera", "viewer", toks["vera"]) + "\n")
    c = Cluster(tmp, etcd_server.endpoints, f"/gptrm-test/web-{uuid.uuid4().hex[:8]}/")
    web = f"127.0.0.1:{free_port()}"
    try:
        (tmp / "queues.toml").write_text(QUEUES)
        c.start_coordinator("c1", "--admin-tokens", str(tmp / "tokens"), "--audit-log", str(tmp / "audit.log"),
                            "--queues", str(tmp / "queues.toml"), "--web-listen", web)
        con = Console(c, web, toks, tmp / "audit.log")
        wait_until(lambda: c.ctl("--token", toks["root"], "status").returncode == 0, what="c1 up")
        c.start_agent("n1", *ROOT_TASKS_AGENT, "--labels", "rack=r1")
        wait_until(lambda: con.ctl("nodes")["nodes"], what="n1 registered")
        yield con
    finally:
        c.stop()


def test_pages_need_sign_in_and_carry_the_security_headers(console: Console) -> None:
    """Without a session every page sends the browser to the sign-in form, a live stream is refused, and every
    answer carries the strict Content-Security-Policy and no-store."""
    for path in ("/", "/tasks", "/queues", "/services", "/events", "/tasks/t-1"):
        r = console.request("GET", path)
        assert r.status == 303 and r.headers["Location"] == "/signin", path
    assert console.request("GET", "/live/tasks").status == 401
    r = console.request("GET", "/signin")
    csp = r.headers["Content-Security-Policy"]
    assert r.status == 200 and "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe" not in csp
    assert r.headers["Cache-Control"] == "no-store" and r.headers["X-Content-Type-Options"] == "nosniff"


def test_sign_in_sets_a_strict_cookie_and_is_audited(console: Console) -> None:
    """A token posted to the form gives an HttpOnly, SameSite=Strict session cookie (not the token), audited;
    a wrong token is refused and audited too; a form posted from another origin is refused; a body over
    the limit is refused."""
    r = console.request("POST", "/signin", {"token": console.tokens["vera"]})
    cookie = r.headers["Set-Cookie"]
    assert r.status == 303 and r.headers["Location"] == "/"
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and console.tokens["vera"] not in cookie
    session = cookie.split(";", 1)[0]
    assert console.request("GET", "/tasks", headers={"Cookie": session}).status == 200
    assert console.request("POST", "/signin", {"token": "gptrm_wrong"}).status == 403
    records = [r for r in console.audit_records() if r["method"] == "WebSignIn"]
    assert {(r["principal"], r["outcome"]) for r in records} >= {("vera", "ok"), ("", "refused")}
    assert console.request("POST", "/signin", {"token": console.tokens["vera"]},
                           headers={"Origin": "http://evil.invalid"}).status == 403
    assert console.request("POST", "/signin", {"token": "x" * 20000}).status == 413


def test_client_certificate_signs_in_where_the_coordinator_uses_mutual_tls(
        tmp_path: Path, etcd_server: EtcdCluster) -> None:
    """With mutual TLS the console serves HTTPS with the coordinator's certificate: a viewer's client
    certificate is its holder without a sign-in, a browser without one is sent to the token form, and a
    node's certificate is refused."""
    pki = tmp_path / "pki"
    for argv in (["ca", "create"], ["issue", "coordinator", "127.0.0.1"], ["issue", "viewer", "eve"],
                 ["issue", "node", "n1"]):
        assert ctl_main(["certs", "--dir", str(pki), *argv]) == 0
    c = Cluster(tmp_path, etcd_server.endpoints, f"/gptrm-test/web-tls-{uuid.uuid4().hex[:8]}/")
    web = f"127.0.0.1:{free_port()}"
    try:
        c.start_coordinator("c1", "--tls-cert", str(pki / "coordinator-127.0.0.1.crt"), "--tls-key",
                            str(pki / "coordinator-127.0.0.1.key"), "--tls-ca", str(pki / "ca.crt"),
                            "--web-listen", web)

        def get(stem: str | None) -> tuple[int, str]:
            ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            if stem is not None:
                ctx.load_cert_chain(str(pki / f"{stem}.crt"), str(pki / f"{stem}.key"))
            host, port = web.rsplit(":", 1)
            conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
            conn.request("GET", "/tasks")
            r = conn.getresponse()
            return r.status, r.read().decode()
        status, page = wait_until(lambda: _answers(get, "viewer-eve"), 60, what="the console over HTTPS")
        assert status == 200 and "eve (viewer)" in page and "Sign out" not in page
        assert get(None)[0] == 303
        assert get("node-n1")[0] == 403
    finally:
        c.stop()


def _answers(get: Any, stem: str) -> tuple[int, str] | None:
    try:
        return get(stem)
    except OSError:
        return None


def test_standby_serves_its_own_view_and_says_so(console: Console) -> None:
    """A standby's console (its own sign-in) lists what etcd holds, under a banner naming the leader."""
    web2 = f"127.0.0.1:{free_port()}"
    console.cluster.start_coordinator("c2", "--admin-tokens", str(console.audit.parent / "tokens"), "--queues",
                                      str(console.audit.parent / "queues.toml"), "--web-listen", web2)
    task = console.ctl("submit", *ROOT_TASKS_SUBMIT, "--name", "seen-from-the-standby", "--cpu", "0.1", "--",
                       "sleep", "600")["task_id"]
    standby = Console(console.cluster, web2, console.tokens, console.audit)
    signed = wait_until(lambda: _signed_in(standby, "vera"), 30, what="c2's console")
    page = wait_until(lambda: (b := _body(standby, "/tasks", signed)) and task in b and b, 30,
                      what="the task listed by the standby")
    assert "Standby c2" in page and "leader: c1" in page
    console.ctl("cancel", task)


def _signed_in(con: Console, who: str) -> str | None:
    try:
        r = con.request("POST", "/signin", {"token": con.tokens[who]})
    except OSError:
        return None
    return r.headers["Set-Cookie"].split(";", 1)[0] if r.status == 303 else None


def _body(con: Console, path: str, cookie: str) -> str:
    host, port = con.web.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path, headers={"Cookie": cookie})
    return conn.getresponse().read().decode()


# ---- in the browser -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """The system's Chromium, headless, with an empty profile and nothing that reaches the network."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    assert not missing, f"{missing} missing: `make system-test-deps` installs Debian's chromium and chromium-driver"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="gptrm-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _shot(driver: Any, name: str) -> None:
    """The whole page (up to 4,000 pixels high) as DIR/NAME.png when GPTRM_SCREENSHOTS names a DIR."""
    folder = os.environ.get("GPTRM_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        driver.set_window_size(1400, min(max(height + 140, 600), 4000))
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))
        driver.set_window_size(1400, 1000)


def _sign_in(driver: Any, console: Console, who: str) -> None:
    from selenium.webdriver.common.by import By
    driver.delete_all_cookies()
    driver.get(f"http://{console.web}/")
    wait_until(lambda: driver.current_url.endswith("/signin"), 10, what="the sign-in form")
    _shot(driver, "signin")
    driver.find_element(By.NAME, "token").send_keys(console.tokens[who])
    driver.find_element(By.CSS_SELECTOR, "form button").click()
    wait_until(lambda: any(f"{who} (" in e.text for e in driver.find_elements(By.CLASS_NAME, "who")), 10,
               what=f"{who} signed in (at {driver.current_url}: {driver.page_source[:3000]})")


def _live(driver: Any) -> None:
    """Wait until the page's live stream is open."""
    wait_until(lambda: driver.execute_script("return document.body.dataset.liveState") == "open", 20,
               what="the page's live stream open")


def _cell(driver: Any, table: str, key: str, column: str) -> str:
    return str(driver.execute_script(
        "const r = document.getElementById(arguments[0]); if (!r) return '';"
        "const c = r.querySelector('td[data-k=\"' + arguments[1] + '\"]'); return c ? c.textContent : '';",
        f"{table}:{key}", column))


def test_browser_pages_live_tasks_roles_and_hostile_names(console: Console, browser: Any) -> None:
    """Signed in as the admin, every page renders the cluster's data; a task submitted (named like a script)
    appears in Tasks without a reload, shown as text, and its cancellation changes its state live; its page
    charts its GPU's utilization and streams its log. Signed in as a viewer, the task's log is hidden."""
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    d = browser
    _sign_in(d, console, "root")
    web = f"http://{console.web}"
    d.get(f"{web}/")
    assert d.find_elements(By.ID, "n:n1") and "r1" in d.find_element(By.CSS_SELECTOR, "section.grp h2").text
    assert len(d.find_elements(By.CSS_SELECTOR, "#n\\:n1 i")) == 4   # the agent's four simulated GPUs
    _live(d)
    _shot(d, "fleet")

    d.get(f"{web}/tasks")
    _live(d)
    d.execute_script("window.gptrmNotReloaded = true")
    task = console.ctl("submit", *ROOT_TASKS_SUBMIT, "--name", HOSTILE, "--gpus", "1", "--gpu-mem-gib", "10", "--",
                       "sh", "-c",
                       "printf '%s%s\\n' '<b>not ' 'bold</b>'; exec sleep 600")["task_id"]
    wait_until(lambda: _cell(d, "tasks", task, "name") == HOSTILE, 30, what="the task appearing live in Tasks")
    wait_until(lambda: _cell(d, "tasks", task, "state") == "running", 60, what="the task running, live")
    assert d.execute_script("return window.gptrmNotReloaded") is True
    with pytest.raises(NoAlertPresentException):
        d.switch_to.alert.text   # noqa: B018 - reading it is the check that no alert opened
    _shot(d, "tasks")

    wait_until(lambda: (d.get(f"{web}/tasks/{task}"), d.find_elements(By.CSS_SELECTOR, "figure.util-chart canvas"))[1],
               30, interval_s=1.0, what="the chart of the task's GPU utilization")
    assert d.find_element(By.CSS_SELECTOR, 'dd[data-k="Name"]').text == HOSTILE
    wait_until(lambda: "<b>not bold</b>" in d.find_element(By.ID, "log").text, 30, what="the log, live")
    assert not d.find_elements(By.CSS_SELECTOR, "#log b")
    _shot(d, "task")

    d.get(f"{web}/tasks")
    _live(d)
    d.execute_script("window.gptrmNotReloaded = true")
    console.ctl("cancel", task)
    wait_until(lambda: _cell(d, "tasks", task, "state") == "cancelled", 60, what="the cancellation, live")
    assert d.execute_script("return window.gptrmNotReloaded") is True

    sid = console.ctl("submit", *ROOT_TASKS_SUBMIT, "--name", "llm", "--replicas", "1:2", "--target-util", "0.6",
                      "--gpus", "1", "--gpu-mem-gib", "1", "--cpu", "0.1", "--", "sh", "-c",
                      "exec sleep 600")["service_id"]
    wait_until(lambda: (d.get(f"{web}/services"), d.find_elements(By.ID, f"services:{sid}"))[1], 60, interval_s=1.0,
               what="the service listed")
    wait_until(lambda: d.find_elements(By.CSS_SELECTOR, "figure.chart canvas"), 30, what="its load chart drawn")
    assert _cell(d, "services", sid, "name") == "llm"
    d.get(f"{web}/queues")
    wait_until(lambda: _cell(d, "queues", "team", "used") == "1", 30, what="the service's GPU counted in team's queue")
    assert _cell(d, "queues", "team", "quota") == "2" and _cell(d, "queues", "lab", "gate") == "run"
    assert len(d.find_elements(By.CSS_SELECTOR, ".bars meter")) >= 7   # used, borrowed, hours per queue; lab's budget
    for path, name, marker in (("/queues", "queues", "queues:team"), ("/services", "services", f"services:{sid}"),
                               ("/events", "events", "events")):
        d.get(f"{web}{path}")
        assert d.find_elements(By.ID, marker), path
        _live(d)
        _shot(d, name)
    assert task in d.find_element(By.ID, "events").text   # the task's own events are listed

    _sign_in(d, console, "vera")
    d.get(f"{web}/tasks/{task}")
    assert "Logs are hidden" in d.find_element(By.ID, "log-hidden").text
    assert not d.find_elements(By.ID, "log") and "not bold" not in d.page_source
    _shot(d, "task-viewer")


def test_browser_an_array_is_one_line_that_lists_its_elements(console: Console, browser: Any) -> None:
    """An array of six is one line of Tasks (its counts by state as the reason, no line per element); its id links
    to the list of its six elements."""
    from selenium.webdriver.common.by import By
    d = browser
    _sign_in(d, console, "root")
    web = f"http://{console.web}"
    first = console.ctl("submit", *ROOT_TASKS_SUBMIT, "--name", "sweep", "--array", "0-5%2", "--gpus", "0",
                        "--cpu", "0.1", "--", "sh", "-c", "exec sleep 600")
    array_id = first["array_id"]
    try:
        d.get(f"{web}/tasks")
        wait_until(lambda: _cell(d, "tasks", array_id, "reason").startswith("array of 6 (%2): "), 30,
                   what="the array's line")
        assert _cell(d, "tasks", array_id, "name") == "sweep"
        assert not d.find_elements(By.CSS_SELECTOR, f'tr[id^="tasks:{array_id}_"]')   # no line per element
        _shot(d, "tasks-array")
        d.find_element(By.CSS_SELECTOR, f'tr[id="tasks:{array_id}"] a').click()
        wait_until(lambda: f"array={array_id}" in d.current_url, 10, what="the list of its elements")
        rows = d.find_elements(By.CSS_SELECTOR, f'tr[id^="tasks:{array_id}_"]')
        assert sorted(r.get_attribute("id") for r in rows) == [f"tasks:{array_id}_{i}" for i in range(6)]
        assert _cell(d, "tasks", f"{array_id}_0", "name") == "sweep"
        _live(d)
    finally:
        console.ctl("cancel", array_id)
