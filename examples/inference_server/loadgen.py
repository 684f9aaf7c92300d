"""A load generator that times its own requests, to check the p99 a service reports (issue 29).

    python examples/inference_server/loadgen.py --url http://127.0.0.1:8080/predict --rate 100 --duration 10

Requests are due every 1/rate seconds, spread over ``--connections`` threads, each with one
keep-alive HTTP/1.1 connection; a request is timed from when it is sent to when its answer is
read. A thread still waiting for an answer sends its next request late: ``behind_ms`` is the
most any request was sent after it was due (a server slower than the rate over the connections
shows there, and the p99 alone would hide it: coordinated omission). Prints a table, then one
JSON line: the requests, errors, p50 / p99 / max in ms of what this client measured, the
achieved rate, ``behind_ms``, and ``windows``: the p99 per ``--window-s`` slice of the run
(``[start_s, end_s, p99_ms, requests]``, seconds since ``started_at``, epoch seconds) so a
server's per-window p99 can be compared window by window.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from urllib.parse import urlsplit


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted values (what "p99 of the requests" means)."""
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))] if ordered else 0.0


def run(url: str, *, rate: float, duration_s: float, connections: int, batch: int = 0, timeout_s: float = 10.0) -> dict[str, object]:
    target = urlsplit(url)
    path = (target.path or "/") + (f"?batch={batch}" if batch else "")  # rows per request; 0: the server's own batch
    body = b""
    period = 1.0 / rate
    count = int(rate * duration_s)
    start = time.perf_counter() + 0.05
    wall0 = time.time() + 0.05
    timed: list[tuple[float, float]] = []  # (sent, latency_s), sent since the start
    behind = [0.0]
    errors: list[str] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=timeout_s)
        for i in range(k, count, connections):
            due = start + i * period
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent = time.perf_counter()
            try:
                conn.request("POST", path, body=body, headers={"Content-Length": str(len(body))})
                conn.getresponse().read()
                done = time.perf_counter()
                with lock:
                    timed.append((sent - start, done - sent))
                    behind[0] = max(behind[0], sent - due)
            except (OSError, http.client.HTTPException) as error:
                conn.close()
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=timeout_s)
                with lock:
                    errors.append(str(error))
        conn.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ordered = sorted(lat for _, lat in timed)
    return {"requests": len(ordered), "errors": len(errors), "rate": len(ordered) / elapsed if elapsed > 0 else 0.0,
            "p50_ms": percentile(ordered, 0.5) * 1000, "p99_ms": percentile(ordered, 0.99) * 1000,
            "max_ms": (ordered[-1] if ordered else 0.0) * 1000, "behind_ms": behind[0] * 1000, "started_at": wall0,
            "latencies": timed}


def windows(timed: list[tuple[float, float]], window_s: float) -> list[list[float]]:
    out: dict[int, list[float]] = {}
    for sent, lat in timed:
        out.setdefault(int(sent // window_s), []).append(lat)
    return [[k * window_s, (k + 1) * window_s, percentile(sorted(v), 0.99) * 1000, len(v)] for k, v in sorted(out.items())]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="loadgen")
    p.add_argument("--url", required=True)
    p.add_argument("--rate", type=float, default=100.0, help="requests per second (open loop)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--window-s", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=0, help="rows per request, ?batch=N (0: the server's default batch)")
    args = p.parse_args(argv)
    result = run(args.url, rate=args.rate, duration_s=args.duration, connections=args.connections, batch=args.batch)
    timed = result.pop("latencies")
    result["windows"] = windows(timed, args.window_s)  # type: ignore[arg-type]
    print(f"{'requests':>9} {'errors':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    print(f"{result['requests']:>9} {result['errors']:>7} {result['rate']:>8.1f} {result['p50_ms']:>8.2f} "
          f"{result['p99_ms']:>8.2f} {result['max_ms']:>8.2f}")
    print(json.dumps(result))
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
