"""Cell allocation benchmark (HiveD §5.3's scalability setup).

A cluster of 8 racks x 1,024 nodes x 8 GPUs (65,536 GPUs; levels GPU, PCIe switch, CPU
socket, node, rack) shared by several VCs receives a seeded stream of allocation requests
(gangs at random levels: 1, 2, 4, 8 GPUs in one pod, or 2-8 whole nodes), guaranteed and
opportunistic, with releases after a random lifetime. Figures: mean and p99 time per
request (`schedule` + `add_allocated_pod` for every pod of the gang), and the time to rebuild
a fresh scheduler's state from the recorded binding log (HiveD's crash recovery).

HiveD reports 2.18 ms per request on this setup; hivemux's target is a mean of at most 0.2 ms.
Run: `python benchmarks/cells.py [--scheduler hived|quota] [--racks 8 --nodes-per-rack 1024]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hivemux.cells import api
from hivemux.cells.config import HivedConfig, parse_config
from hivemux.cells.schedulers import build_scheduler


def cluster_config(racks: int, nodes_per_rack: int) -> dict[str, Any]:
    nodes = racks * nodes_per_rack
    return {
        "physicalCluster": {
            "cellTypes": {
                "PCIE": {"childCellType": "A100", "childCellNumber": 2},
                "SOCKET": {"childCellType": "PCIE", "childCellNumber": 2},
                "NODE": {"childCellType": "SOCKET", "childCellNumber": 2, "isNodeLevel": True},
                "RACK": {"childCellType": "NODE", "childCellNumber": nodes_per_rack},
            },
            "physicalCells": [
                {"cellType": "RACK", "cellChildren": [{"cellAddress": f"r{r}-n{n}"} for n in range(nodes_per_rack)]}
                for r in range(racks)
            ],
        },
        # About 70 % of the cluster reserved, at every level; the rest is opportunistic capacity.
        "virtualClusters": {
            "vc-racks": {"virtualCells": [{"cellType": "RACK", "cellNumber": max(1, racks // 4)}]},
            "vc-nodes": {"virtualCells": [{"cellType": "RACK.NODE", "cellNumber": nodes // 5}]},
            "vc-sockets": {"virtualCells": [{"cellType": "RACK.NODE.SOCKET", "cellNumber": nodes // 5}]},
            "vc-pcie": {"virtualCells": [{"cellType": "RACK.NODE.SOCKET.PCIE", "cellNumber": nodes // 5}]},
        },
    }


@dataclass(frozen=True)
class Request:
    group: str
    vc: str
    priority: int
    pods: int
    gpus_per_pod: int
    lifetime: int  # released after this many later requests


def make_requests(n: int, seed: int, vcs: list[str]) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if rng.random() < 0.85:
            pods, gpus = 1, rng.choice([1, 1, 1, 2, 2, 4, 8])
        else:
            pods, gpus = rng.choice([2, 4, 8]), 8
        priority = -1 if rng.random() < 0.3 else rng.randint(0, 1000)
        out.append(Request(f"g{i}", rng.choice(vcs), priority, pods, gpus, rng.randint(5, 400)))
    return out


def pods_of(r: Request) -> list[api.Pod]:
    group = api.AffinityGroupSpec(r.group, (api.AffinityGroupMember(r.pods, r.gpus_per_pod),))
    spec = api.PodSchedulingSpec(virtual_cluster=r.vc, priority=r.priority, leaf_cell_number=r.gpus_per_pod, affinity_group=group)
    return [api.Pod(f"{r.group}-{k}", spec) for k in range(r.pods)]


def run(scheduler: api.CellScheduler, requests: list[Request]) -> tuple[list[float], list[tuple[str, api.Pod, api.BindInfo | None]], dict[str, int]]:
    """Time each request; return per-request seconds, the binding log, and outcome counts."""
    timings: list[float] = []
    log: list[tuple[str, api.Pod, api.BindInfo | None]] = []
    releases: dict[int, list[list[api.Pod]]] = {}
    outcomes = {"bound": 0, "preempt": 0, "wait": 0, "user_error": 0}
    for i, request in enumerate(requests):
        for pods in releases.pop(i, []):
            for p in pods:
                scheduler.delete_allocated_pod(p)
                log.append(("delete", p, None))
        pods = pods_of(request)
        bound: list[api.Pod] = []
        start = time.perf_counter()
        for p in pods:
            result = scheduler.schedule(p)
            if not isinstance(result, api.Bind):
                break
            scheduler.add_allocated_pod(p, result.bind_info)
            bound.append(p)
            log.append(("add", p, result.bind_info))
        timings.append(time.perf_counter() - start)
        if len(bound) == len(pods):
            outcomes["bound"] += 1
            releases.setdefault(i + request.lifetime, []).append(bound)
        else:
            kind = {api.Preempt: "preempt", api.Wait: "wait", api.UserError: "user_error"}[type(result)]
            outcomes[kind] += 1
            for p in bound:  # a gang is all or nothing
                scheduler.delete_allocated_pod(p)
                log.append(("delete", p, None))
    return timings, log, outcomes


def rebuild(make: Callable[[], api.CellScheduler], log: list[tuple[str, api.Pod, api.BindInfo | None]]) -> float:
    scheduler = make()
    start = time.perf_counter()
    for op, pod, info in log:
        if op == "add":
            assert info is not None
            scheduler.add_allocated_pod(pod, info)
        else:
            scheduler.delete_allocated_pod(pod)
    return time.perf_counter() - start


def factory(name: str, config: HivedConfig) -> Callable[[], api.CellScheduler]:
    return lambda: build_scheduler(name, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", choices=["hived", "quota"], default="hived")
    parser.add_argument("--racks", type=int, default=8)
    parser.add_argument("--nodes-per-rack", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--bindings", type=int, default=100_000, help="binding records to rebuild from")
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args()

    raw = cluster_config(args.racks, args.nodes_per_rack)
    start = time.perf_counter()
    config = parse_config(raw)
    parse_s = time.perf_counter() - start
    make = factory(args.scheduler, config)
    start = time.perf_counter()
    scheduler = make()
    build_s = time.perf_counter() - start
    # The cell trees live as long as the scheduler: move them out of the cyclic collector's
    # generations so that collections triggered by request garbage do not rescan them. A service
    # does the same after building its scheduler (``gc.freeze()``, Python >= 3.7).
    gc.freeze()
    requests = make_requests(args.requests, args.seed, sorted(raw["virtualClusters"]))
    timings, log, outcomes = run(scheduler, requests)
    # The rebuild log: keep requesting (untimed) until it holds enough records.
    extra_seed = args.seed
    while len(log) < args.bindings:
        extra_seed += 1
        more = make_requests(args.requests, extra_seed, sorted(raw["virtualClusters"]))
        more = [Request(f"{r.group}-{extra_seed}", r.vc, r.priority, r.pods, r.gpus_per_pod, r.lifetime) for r in more]
        log += run(scheduler, more)[1]
    log = log[: args.bindings]
    rebuild_s = rebuild(make, log)

    gpus = args.racks * args.nodes_per_rack * 8
    ms = [t * 1000 for t in timings]
    figures = {
        "mean_ms_per_request": statistics.fmean(ms),
        "median_ms_per_request": statistics.median(ms),
        "p99_ms_per_request": statistics.quantiles(ms, n=100)[98],
        "rebuild_s": rebuild_s,
        "rebuild_records": len(log),
        "parse_config_s": parse_s,
        "build_scheduler_s": build_s,
    }
    print(f"cells: {args.scheduler} scheduler, {gpus:,} GPUs ({args.racks} racks x {args.nodes_per_rack} nodes x 8), "
          f"{args.requests:,} requests, seed {args.seed}")
    print(f"outcomes: {outcomes}")
    print(f"{'figure':<28} {'value':>12}")
    for key, value in figures.items():
        print(f"{key:<28} {value:>12,}" if isinstance(value, int) else f"{key:<28} {value:>12.4f}")
    print(json.dumps({"benchmark": "cells", "scheduler": args.scheduler, "gpus": gpus, "requests": args.requests,
                      **{k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}, "outcomes": outcomes}))


if __name__ == "__main__":
    main()
