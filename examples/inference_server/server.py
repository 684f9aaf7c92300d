"""A small real inference server, the kind a team puts on hivemux as an online service (issue 29).

    PORT=8080 python examples/inference_server/server.py [--hidden 256] [--batch-size 8]

A CPU PyTorch model (a three-layer MLP over 64 features, about 3 ms per batch of 32 on one core
of this machine; one torch thread), served by the
standard library's threading HTTP server:

- ``POST /predict`` (or ``GET``): one forward pass over ``--batch-size`` rows, or ``?batch=N``
  random rows (a JSON body ``{"inputs": [[64 floats], ...]}`` is used when given); answers the
  argmax per row;
- ``GET /healthz``: 200 once the model is loaded and warmed up, 503 before (hivemux's
  ``readiness: {http: /healthz}``);
- ``GET /metrics``: the Prometheus exposition (prometheus_client), with the histogram
  ``inference_request_duration_seconds`` of every request's handling time, in seconds
  (hivemux's ``metrics: {path: /metrics, histogram: inference_request_duration_seconds}``).
  With ``METRICS_PORT`` in the environment (``ports: [{name: METRICS_PORT}]``) the exposition
  is also served there.

It listens on ``$PORT`` (the executor allocates it), on every address, and ends on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import torch
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest, start_http_server

# prometheus_client's default buckets, with two more below 5 ms for a small CPU model.
MAX_BATCH = 8192  # rows one request may ask for (?batch=N)
BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inference_server")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--extra-ms", type=float, default=0.0, help="added service time per request (to model a heavier model)")
    args = p.parse_args(argv)
    registry = CollectorRegistry()
    latency = Histogram("inference_request_duration_seconds", "Time to handle one inference request",
                        ["route"], buckets=BUCKETS, registry=registry)
    predict_latency = latency.labels("predict")  # exposed (at zero) from the start: a first scrape is a baseline
    ready = threading.Event()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden),
                                torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10)).eval()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a load generator's connection is reused
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms wait for a delayed ACK

        def log_message(self, *_: object) -> None:  # no line per request in the job's log
            pass

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _predict(self) -> None:
            begin = time.perf_counter()
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            query = parse_qs(urlsplit(self.path).query)
            batch = min(int(query.get("batch", [args.batch_size])[0]), MAX_BATCH)
            rows = torch.tensor(json.loads(body)["inputs"], dtype=torch.float32) if body else torch.randn(batch, 64)
            with torch.no_grad():
                out = model(rows).argmax(dim=1).tolist()
            if args.extra_ms:
                time.sleep(args.extra_ms / 1000)
            self._send(200, json.dumps({"classes": out}).encode())
            predict_latency.observe(time.perf_counter() - begin)

        def do_POST(self) -> None:
            if urlsplit(self.path).path == "/predict":
                self._predict()
            else:
                self._send(404, b"{}")

        def do_GET(self) -> None:
            if urlsplit(self.path).path == "/predict":
                self._predict()
            elif self.path == "/healthz":
                self._send(200 if ready.is_set() else 503, b'{"ready": %s}' % (b"true" if ready.is_set() else b"false"))
            elif self.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b"{}")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = ThreadingHTTPServer(("", args.port), Handler)
    server.daemon_threads = True
    if os.environ.get("METRICS_PORT"):
        start_http_server(int(os.environ["METRICS_PORT"]), registry=registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with torch.no_grad():  # warm-up: the first passes are slow; not ready until they are done
        for _ in range(20):
            model(torch.randn(args.batch_size, 64))
    ready.set()
    print(f"serving on port {args.port}", flush=True)
    while not stop.wait(0.5):  # the main thread only waits for SIGTERM / SIGINT
        pass
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
