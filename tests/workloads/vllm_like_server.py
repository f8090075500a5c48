"""A test workload that publishes vLLM-named Prometheus metrics whose latency rises with load.

No model runs: a background thread "serves" the offered load (requests per second) and
records each request in prometheus-client metrics named as vLLM names them, with vLLM's
buckets. With an offered load of L requests/s (deterministic, so tests can assert values):

- end-to-end latency per request: ``0.25 + 0.05 L`` seconds;
- time to first token: ``0.02 + 0.01 L`` seconds;
- 64 generated tokens per request, so ``64 L`` tokens/s;
- requests in the system by Little's law ``L × latency``: up to 8 running, the rest waiting.

Control, on the same port:

- ``GET /control?load=L`` sets the offered load; ``GET /control?mode=M`` sets how
  ``/metrics`` answers: ``normal``; ``hang`` (accepts, never answers until the mode
  changes); ``garbage`` (HTTP 200 with text that is not an exposition); ``trickle`` (one
  line every 0.2 s, for a minute); ``huge`` (8 MiB of comments then the metrics).
- ``GET /control`` alone returns the current settings as JSON, with ``trickles_cut``: how many
  trickled answers the client hung up on before their end.

Run: ``python tests/workloads/vllm_like_server.py --port 8000 [--load 2] [--mode normal]``;
port 0 picks a free port, printed as ``listening on PORT`` and written to ``--port-file``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MODES = ("normal", "hang", "garbage", "trickle", "huge")
MODEL = "test-model"
TOKENS_PER_REQUEST = 64
MAX_RUNNING = 8
# vLLM's buckets for these two histograms.
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TICK_S = 0.1


def e2e_latency_s(load: float) -> float:
    """End-to-end latency of a request at an offered load of ``load`` requests/s."""
    return 0.25 + 0.05 * load


def ttft_s(load: float) -> float:
    """Time to first token at an offered load of ``load`` requests/s."""
    return 0.02 + 0.01 * load


class Workload:
    """The simulated server's state and metrics.

    :param load: initial offered load, requests/s.
    :param mode: initial ``/metrics`` behaviour.
    """

    def __init__(self, load: float, mode: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "end-to-end request latency", labels,
                             buckets=E2E_BUCKETS, registry=self.registry).labels(MODEL)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "time to first token", labels,
                              buckets=TTFT_BUCKETS, registry=self.registry).labels(MODEL)
        self.tokens = Counter("vllm:generation_tokens", "generated tokens", labels,
                              registry=self.registry).labels(MODEL)
        self.running = Gauge("vllm:num_requests_running", "requests running", labels,
                             registry=self.registry).labels(MODEL)
        self.waiting = Gauge("vllm:num_requests_waiting", "requests waiting", labels,
                             registry=self.registry).labels(MODEL)
        self.lock = threading.Lock()
        self.load = load
        self.mode = mode
        self.mode_changed = threading.Condition(self.lock)
        self.trickles_cut = 0
        self._owed = 0.0

    def tick(self, dt: float) -> None:
        """Serve ``dt`` seconds of the offered load."""
        with self.lock:
            load = self.load
        self._owed += load * dt
        latency, first = e2e_latency_s(load), ttft_s(load)
        while self._owed >= 1.0:
            self._owed -= 1.0
            self.e2e.observe(latency)
            self.ttft.observe(first)
            self.tokens.inc(TOKENS_PER_REQUEST)
        in_system = load * latency
        self.running.set(min(in_system, MAX_RUNNING))
        self.waiting.set(max(0.0, in_system - MAX_RUNNING))

    def run(self, stop: threading.Event) -> None:
        """Tick every 0.1 s until ``stop`` is set."""
        last = time.monotonic()
        while not stop.wait(TICK_S):
            now = time.monotonic()
            self.tick(now - last)
            last = now

    def set(self, load: float | None, mode: str | None) -> None:
        with self.lock:
            if load is not None:
                self.load = load
            if mode is not None:
                self.mode = mode
            self.mode_changed.notify_all()

    def settings(self) -> dict[str, object]:
        with self.lock:
            return {"load": self.load, "mode": self.mode, "trickles_cut": self.trickles_cut}


def make_handler(workload: Workload) -> type[BaseHTTPRequestHandler]:
    """The request handler class bound to ``workload``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the agent scrapes every tick."""

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/control":
                self._control(parse_qs(url.query))
            elif url.path == "/metrics":
                self._metrics()
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _control(self, query: dict[str, list[str]]) -> None:
            try:
                load = float(query["load"][0]) if "load" in query else None
                mode = query["mode"][0] if "mode" in query else None
                if (load is not None and not 0 <= load <= 10_000) or (mode is not None and mode not in MODES):
                    raise ValueError(f"load in [0, 10000], mode one of {MODES}")
            except ValueError as e:
                self._reply(400, f"{e}\n".encode())
                return
            workload.set(load, mode)
            self._reply(200, json.dumps(workload.settings()).encode(), "application/json")

        def _metrics(self) -> None:
            mode = workload.settings()["mode"]
            if mode == "hang":
                with workload.lock:
                    workload.mode_changed.wait_for(lambda: workload.mode != "hang", timeout=3600)
                return   # close without a response
            if mode == "garbage":
                self._reply(200, b"this is { not an exposition\n\x00\x01 vllm:e2e 1 2 3 4\n}")
                return
            body = generate_latest(workload.registry)
            if mode == "huge":
                body = b"# padding\n" * (8 * 1024 * 1024 // 10) + body
            if mode == "trickle":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                try:
                    for _ in range(300):
                        self.wfile.write(b"# still coming\n")
                        self.wfile.flush()
                        time.sleep(0.2)
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    with workload.lock:
                        workload.trickles_cut += 1
                return
            self._reply(200, body, "text/plain; version=0.0.4; charset=utf-8")

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", help="write the port here once listening")
    p.add_argument("--load", type=float, default=2.0, help="offered load, requests/s")
    p.add_argument("--mode", choices=MODES, default="normal")
    args = p.parse_args(argv)
    workload = Workload(args.load, args.mode)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(workload))
    server.daemon_threads = True
    stop = threading.Event()
    threading.Thread(target=workload.run, args=(stop,), name="load", daemon=True).start()
    port = server.server_address[1]
    print(f"listening on {port}", flush=True)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as fh:
            fh.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
