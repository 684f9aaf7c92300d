"""Salus gate benchmark: the iteration gate's cost and what SRTF buys over FIFO (Salus §3.2, §5.1).

A ``LaneServer`` runs on a temporary Unix socket in this process's event loop; every job is a
separate client process (spawned) using the ``hivemux.salus`` adaptor, as a workload would.

Figures:
- gate round trip: one job alone in its lane, empty iterations; the time from the end of one
  iteration's body to the start of the next (report done + request, grant back). Median and
  p99; target median <= 200 us.
- job switch gap: two jobs sharing one lane under FAIR (they alternate); the time from the end
  of one job's iteration to the start of the other job's next one. Median and p99; target
  median <= 1 ms.
- SRTF / FIFO average completion time: a seeded mix of jobs (a long background job, then short
  trial runs of 4-12 iterations and long trainings of 60-120, about 7 : 3; each iteration a 5 ms
  CPU busy loop) arriving 25 ms apart into one lane (the capacity fits one lane, as in the
  paper's §5.1.2 single-lane setup); completion time counts from arrival, and includes
  connecting to the gate. Median of ``--repeats`` mixes.
- transport: a unary echo call vs a message round trip on one bidirectional stream (gRPC
  generic handlers, same socket kind, no gate logic, grpc.aio server, grpcio's synchronous
  client): the measurement behind the gate's one-stream-per-job design. Then the stream echo
  with the adaptor's direct client (``_DirectStream``: one batch per round trip, driven from the
  job's thread), against the grpc.aio server and against grpcio's core server polled by one
  thread of its own (as ``LaneServer``'s default ``core`` transport): the measurements behind
  the gate's transport, and the floor under its round trip.

Run: ``python benchmarks/salus.py [--samples 3000 --jobs 8 --repeats 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import random
import statistics
import tempfile
import threading
import time
from typing import Any

SEED = 7
CAPACITY_MIB = 16_000.0
PERSISTENT_MIB = 500.0
EPHEMERAL_MIB = 9_000.0  # two lanes never fit in 16 GB: every job shares lane 0
ITERATION_S = 0.005
ARRIVAL_GAP_S = 0.025


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# -- client processes (top level: spawned children import this module) --------------------------


def timed_job(socket: str, name: str, iterations: int, body_s: float, offset: float, go: Any, start: Any,
              results: Any, ephemeral_mib: float = EPHEMERAL_MIB, sleep_s: float = 0.0) -> None:  # fmt: skip
    """Arrive ``offset`` s after the common start; run ``iterations`` through the gate; report
    the arrival, the finish and (start, end) perf_counter stamps of each body."""
    from hivemux import salus
    from hivemux.salus.grpc_setup import grpc_modules

    grpc_modules()  # the gRPC setting, then grpcio: loaded before the clock starts, as before
    results.put(("ready", name))
    go.wait()
    start_at = start.value + offset
    delay = start_at - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    stamps = []
    with salus.job(name, persistent_mib=PERSISTENT_MIB, ephemeral_mib=ephemeral_mib, iterations=iterations,
                   iteration_seconds=body_s, socket=socket) as gate:  # fmt: skip
        for _ in gate.iterations():
            began = time.perf_counter()
            if body_s:
                busy(body_s)
            if sleep_s:  # the iteration's GPU work: the CPU is free meanwhile
                time.sleep(sleep_s)
            stamps.append((began, time.perf_counter()))
    results.put((name, start_at, time.perf_counter(), stamps))


def echo_client(socket: str, samples: int, results: Any) -> None:
    import grpc

    ident = lambda b: b  # noqa: E731
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        unary = channel.unary_unary("/bench.Echo/Unary", ident, ident)
        unary_times = []
        for i in range(samples + 200):
            began = time.perf_counter()
            unary(b"x")
            if i >= 200:
                unary_times.append(time.perf_counter() - began)
        outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

        def requests() -> Any:
            while (message := outbox.get()) is not None:
                yield message

        responses = channel.stream_stream("/bench.Echo/Stream", ident, ident)(requests())
        stream_times = []
        for i in range(samples + 200):
            began = time.perf_counter()
            outbox.put(b"x")
            next(responses)
            if i >= 200:
                stream_times.append(time.perf_counter() - began)
        outbox.put(None)
    results.put((unary_times, stream_times, direct_echo(socket, samples)))


def direct_echo(socket: str, samples: int) -> list[float]:
    """Stream echo round trips with the adaptor's direct client (one send+receive batch each)."""
    import grpc

    from hivemux.salus.client import _DirectStream

    with grpc.insecure_channel(f"unix:{socket}") as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stream = _DirectStream(channel, "/bench.Echo/Stream")
        times = []
        for i in range(samples + 200):
            began = time.perf_counter()
            stream.exchange(b"x")
            if i >= 200:
                times.append(time.perf_counter() - began)
        stream.finish()
    return times


def direct_echo_client(socket: str, samples: int, results: Any) -> None:
    results.put(direct_echo(socket, samples))


def core_echo_server(socket: str, stop: Any) -> None:
    """A stream echo on grpcio's core server, polled by the calling thread (no gate logic)."""
    from grpc._cython import cygrpc

    from hivemux.salus.server import GRPC_OPTIONS

    queue_, server = cygrpc.CompletionQueue(), cygrpc.Server(tuple(GRPC_OPTIONS), False)
    server.register_completion_queue(queue_)
    server.add_http2_port(f"unix:{socket}".encode())
    server.start()
    server.request_call(queue_, queue_, "call")
    metadata_sent: set[Any] = set()
    while not stop.is_set():
        event = queue_.poll(time.time() + 0.1)
        if event.completion_type == cygrpc.CompletionType.queue_timeout:
            continue
        if event.tag == "call":
            server.request_call(queue_, queue_, "call")
            event.call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), ("received", event.call))
            continue
        kind, call = event.tag
        if kind == "sent":
            call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), ("received", call))
        elif kind == "received":
            message = event.batch_operations[0].message()
            ops = [] if call in metadata_sent else [cygrpc.SendInitialMetadataOperation(None, 0)]
            metadata_sent.add(call)
            if message is None:
                ops.append(cygrpc.SendStatusFromServerOperation(None, cygrpc.StatusCode.ok, b"", 0))
                call.start_server_batch(tuple(ops), ("status", call))
                metadata_sent.discard(call)
            else:
                ops.append(cygrpc.SendMessageOperation(message, 0))
                call.start_server_batch(tuple(ops), ("sent", call))
    server.shutdown(queue_, "shutdown")
    server.cancel_all_calls()


# -- the parent: servers and figures --------------------------------------------------------------


async def run_jobs(ctx: Any, policy: str, jobs: list[tuple[str, int, float, float]],
                   ephemeral_mib: float = EPHEMERAL_MIB, sleep_s: float = 0.0) -> list[tuple]:
    """Start a LaneServer with ``policy`` and one process per (name, iterations, body_s, start offset)."""
    from hivemux.salus.server import LaneServer

    with tempfile.TemporaryDirectory() as tmp:
        socket = os.path.join(tmp, "gate.sock")
        server = LaneServer(socket, CAPACITY_MIB, policy)
        await server.start()
        try:
            results, go, start = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
            procs = [ctx.Process(target=timed_job, args=(socket, name, n, body, offset, go, start, results, ephemeral_mib, sleep_s))
                     for name, n, body, offset in jobs]  # fmt: skip
            for p in procs:
                p.start()
            for _ in procs:  # every process has started and imported the adaptor
                await asyncio.to_thread(results.get, True, 120)
            start.value = time.perf_counter() + 0.02
            go.set()
            out = [await asyncio.to_thread(results.get, True, 120) for _ in procs]
            for p in procs:
                await asyncio.to_thread(p.join)
            return out
        finally:
            await server.stop()


async def gate_round_trip(ctx: Any, samples: int) -> list[float]:
    [(_, _, _, stamps)] = await run_jobs(ctx, "fifo", [("alone", samples + 200, 0.0, 0.0)])
    return [b[0] - a[1] for a, b in zip(stamps[200:], stamps[201:], strict=False)]


async def shared_round_trip(ctx: Any, samples: int, jobs: int, sleep_s: float = 0.0) -> list[float]:
    """Gate round trip while ``jobs`` jobs share the GPU, each in a lane of its own (Algorithm 1
    opens one lane per job: ``jobs × (P + E) <= C``), all iterating at once; every job's round
    trips (end of its body to the start of its next) pooled. ``sleep_s``: each iteration's body
    sleeps that long (GPU work, the CPU free) instead of being empty."""
    ephemeral = (CAPACITY_MIB / jobs) - PERSISTENT_MIB
    out = await run_jobs(ctx, "pack", [(f"j{i}", samples + 200, 0.0, 0.0) for i in range(jobs)], ephemeral, sleep_s)
    return [b[0] - a[1] for _, _, _, stamps in out for a, b in zip(stamps[200:], stamps[201:], strict=False)]


async def switch_gaps(ctx: Any, samples: int) -> list[float]:
    out = await run_jobs(ctx, "fair", [("a", samples // 2 + 100, 0.0002, 0.0), ("b", samples // 2 + 100, 0.0002, 0.0)])
    bodies = sorted((began, ended, name) for name, _, _, stamps in out for began, ended in stamps)
    gaps = [nxt[0] - prev[1] for prev, nxt in zip(bodies, bodies[1:], strict=False) if nxt[2] != prev[2]]
    return gaps[100:]  # past both jobs' start


def job_mix(n: int, rng: random.Random) -> list[tuple[str, int, float, float]]:
    """A long background job first, then a mix of short trial runs (4-12 iterations) and long
    trainings (60-120), about 7 : 3, as in the paper's §5.1.2 SRTF scenario."""
    sizes = [rng.randint(60, 120)] + [rng.randint(60, 120) if rng.random() < 0.3 else rng.randint(4, 12)
                                      for _ in range(n - 1)]  # fmt: skip
    return [(f"job{i}", size, ITERATION_S, i * ARRIVAL_GAP_S) for i, size in enumerate(sizes)]


async def average_completion(ctx: Any, policy: str, mix: list[tuple[str, int, float, float]]) -> float:
    out = await run_jobs(ctx, policy, mix)
    return statistics.mean(finished - arrived for _, arrived, finished, _ in out)


async def transport(ctx: Any, samples: int) -> tuple[list[float], list[float], list[float], list[float]]:
    import grpc

    ident = lambda b: b  # noqa: E731

    async def unary(request: bytes, context: Any) -> bytes:
        return request

    async def stream(requests: Any, context: Any) -> Any:
        async for request in requests:
            yield request

    handler = grpc.method_handlers_generic_handler("bench.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, ident, ident),
        "Stream": grpc.stream_stream_rpc_method_handler(stream, ident, ident),
    })  # fmt: skip
    from hivemux.salus.server import GRPC_OPTIONS

    with tempfile.TemporaryDirectory() as tmp:
        socket = os.path.join(tmp, "echo.sock")
        server = grpc.aio.server(options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{socket}")
        await server.start()
        try:
            results = ctx.Queue()
            p = ctx.Process(target=echo_client, args=(socket, samples, results))
            p.start()
            unary, stream, direct = await asyncio.to_thread(results.get, True, 120)
            await asyncio.to_thread(p.join)
        finally:
            await server.stop(0)
        core_socket, stop = os.path.join(tmp, "core-echo.sock"), threading.Event()
        thread = threading.Thread(target=core_echo_server, args=(core_socket, stop), daemon=True)
        thread.start()
        try:
            p = ctx.Process(target=direct_echo_client, args=(core_socket, samples, results))
            p.start()
            core = await asyncio.to_thread(results.get, True, 120)
            await asyncio.to_thread(p.join)
        finally:
            stop.set()
            await asyncio.to_thread(thread.join)
        return unary, stream, direct, core


async def run(args: argparse.Namespace) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    us = 1e6
    round_trips = await gate_round_trip(ctx, args.samples)
    gaps = await switch_gaps(ctx, args.samples)
    rng = random.Random(SEED)
    ratios, fifo_jct, srtf_jct = [], [], []
    for _ in range(args.repeats):
        mix = job_mix(args.jobs, rng)
        fifo = await average_completion(ctx, "fifo", mix)
        srtf = await average_completion(ctx, "srtf", mix)
        fifo_jct.append(fifo)
        srtf_jct.append(srtf)
        ratios.append(srtf / fifo)
    unary, stream, direct, core = await transport(ctx, args.samples)
    return {
        "gate_round_trip_median_us": statistics.median(round_trips) * us,
        "gate_round_trip_p99_us": percentile(round_trips, 0.99) * us,
        "switch_gap_median_us": statistics.median(gaps) * us,
        "switch_gap_p99_us": percentile(gaps, 0.99) * us,
        "fifo_avg_jct_s": statistics.median(fifo_jct),
        "srtf_avg_jct_s": statistics.median(srtf_jct),
        "srtf_over_fifo_avg_jct": statistics.median(ratios),
        "transport_unary_median_us": statistics.median(unary) * us,
        "transport_stream_median_us": statistics.median(stream) * us,
        "transport_stream_direct_median_us": statistics.median(direct) * us,
        "transport_stream_direct_core_median_us": statistics.median(core) * us,
        "transport_stream_direct_core_p99_us": percentile(core, 0.99) * us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sharing", type=int, default=0,
                        help="only the gate round trip with this many jobs sharing the GPU, each in its own lane")
    parser.add_argument("--body-ms", type=float, default=0.0,
                        help="with --sharing: each iteration sleeps this long (GPU work; the CPU is free meanwhile)")
    args = parser.parse_args()
    if args.sharing:
        trips = asyncio.run(shared_round_trip(mp.get_context("spawn"), args.samples, args.sharing, args.body_ms / 1e3))
        median, p99 = statistics.median(trips) * 1e6, percentile(trips, 0.99) * 1e6
        print(f"salus gate: {args.sharing} jobs sharing one GPU (one lane each, C = {CAPACITY_MIB:g} MiB, P = {PERSISTENT_MIB:g}, "
              f"E = {CAPACITY_MIB / args.sharing - PERSISTENT_MIB:g}), iteration body "
              f"{'empty' if not args.body_ms else f'a {args.body_ms:g} ms sleep'}, {args.samples} samples per job; "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        print(f"gate round trip median (us) {median:10.3f}  target <= 200")
        print(f"gate round trip p99 (us)    {p99:10.3f}")
        print(json.dumps({"benchmark": "salus-sharing", "jobs": args.sharing, "samples": args.samples, "body_ms": args.body_ms,
                          "gate_round_trip_median_us": round(median, 3), "gate_round_trip_p99_us": round(p99, 3)}))
        return
    figures = asyncio.run(run(args))
    print(f"salus gate: unix socket, core server thread + direct client, {args.samples} samples per latency figure; "
          f"job mix: {args.jobs} jobs (1 long, then 7:3 short 4-12 : long 60-120 iterations) of {ITERATION_S * 1e3:g} ms CPU, arriving "
          f"{ARRIVAL_GAP_S * 1e3:g} ms apart, one lane (C = {CAPACITY_MIB:g} MiB, P = {PERSISTENT_MIB:g}, "
          f"E = {EPHEMERAL_MIB:g}), seed {SEED}, median of {args.repeats} mixes; {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'figure':<34} {'value':>10} {'target':>10}")
    rows = [
        ("gate round trip median (us)", figures["gate_round_trip_median_us"], "<= 200"),
        ("gate round trip p99 (us)", figures["gate_round_trip_p99_us"], ""),
        ("job switch gap median (us)", figures["switch_gap_median_us"], "<= 1000"),
        ("job switch gap p99 (us)", figures["switch_gap_p99_us"], ""),
        ("FIFO average JCT (s)", figures["fifo_avg_jct_s"], ""),
        ("SRTF average JCT (s)", figures["srtf_avg_jct_s"], ""),
        ("SRTF / FIFO average JCT", figures["srtf_over_fifo_avg_jct"], "< 1"),
        ("transport: unary echo median (us)", figures["transport_unary_median_us"], ""),
        ("transport: stream echo median (us)", figures["transport_stream_median_us"], ""),
        ("  direct client, aio server (us)", figures["transport_stream_direct_median_us"], ""),
        ("  direct client, core server (us)", figures["transport_stream_direct_core_median_us"], ""),
        ("  direct client, core server p99", figures["transport_stream_direct_core_p99_us"], ""),
    ]
    for name, value, target in rows:
        print(f"{name:<34} {value:>10.3f} {target:>10}")
    print(json.dumps({"benchmark": "salus", **{k: round(v, 4) for k, v in figures.items()}, "samples": args.samples,
                      "jobs": args.jobs, "repeats": args.repeats, "seed": SEED}))  # fmt: skip


if __name__ == "__main__":
    main()
