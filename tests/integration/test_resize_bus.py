"""Resize on an embedded broker and PostgreSQL of its own (issue 19 item 4): `hivemux jobs resize`
grows an online service within its VC's guaranteed headroom (the fleet then serves it on the new
replica), is refused past it with the reason, shrinks it, and neither touches the replicas that
stay: their bindings are as they were and they get no stop and no start; an offline job's SM share is lowered
(an ``adjust`` to its node) and a memory quota past its GPU is refused; the refusals are in
`hivemux jobs history`."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator

import pytest
from support.buskit import eventually, read_all
from support.online_kit import CLUSTER, service_and_offline_job, serving

from hivemux.bus import Publisher, ensure_topics
from hivemux.events import CellBinding, CommandAction, ExecutorCommand, JobResized, Placement
from hivemux.infra import EmbeddedInfra, InfraSettings, embedded_infra
from hivemux.services.cell_allocator.service import AllocatorSettings
from hivemux.services.cell_allocator.service import build as allocator
from hivemux.services.executor.service import ExecutorSettings
from hivemux.services.executor.service import build as executor
from hivemux.services.health_processor.service import HealthSettings
from hivemux.services.health_processor.service import build as health
from hivemux.services.job_controller.service import JobControllerSettings
from hivemux.services.job_controller.service import build as controller
from hivemux.services.matcher.service import MatcherSettings
from hivemux.services.matcher.service import build as matcher
from hivemux.services.projector.service import ProjectorSettings
from hivemux.services.projector.service import build as projector
from hivemux.services.telemetry_ingester.service import IngesterSettings
from hivemux.services.telemetry_ingester.service import build as ingester
from hivemux.topics import ALL_TOPICS, CELL_BINDINGS, EXECUTOR_COMMANDS, JOBS_RESIZES, PLACEMENTS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def infra() -> Iterator[EmbeddedInfra]:
    with embedded_infra(InfraSettings()) as running:
        yield running


async def test_resize_an_online_service_and_an_offline_job(infra: EmbeddedInfra) -> None:
    bootstrap, dsn = infra.endpoints.bootstrap_servers, infra.endpoints.postgres_dsn
    await ensure_topics(bootstrap, ALL_TOPICS)
    tag = uuid.uuid4().hex[:6]
    common = dict(kafka_bootstrap_servers=bootstrap, group_prefix=f"resize{tag}", instance=tag)
    services = [
        controller(JobControllerSettings(**common, unknown_job_wait_s=0.5)),
        allocator(AllocatorSettings(**common, config=CLUSTER, retry_interval_s=1.0)),
        executor(ExecutorSettings(**common, backend="simulated", report_interval_s=0.5)),
        ingester(IngesterSettings(**common, nodes=4, gpus_per_node=4, serving_nodes=0, hot_gpus=0, interval_s=0.5)),
        health(HealthSettings(**common)),
        matcher(MatcherSettings(**common, interval_s=1.0)),
        projector(ProjectorSettings(**common, postgres_dsn=dsn)),
    ]
    tasks = [asyncio.create_task(s.run(install_signal_handlers=False)) for s in services]
    service, offline = f"svc-{tag}", f"off-{tag}"
    env = {k: v for k, v in os.environ.items() if k not in ("HIVEMUX_API_URL", "HIVEMUX_TOKEN")}
    env |= {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "HIVEMUX_POSTGRES_DSN": dsn, "HIVEMUX_PRINCIPAL": "tester"}

    async def cli(*args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(sys.executable, "-m", "hivemux.cli.main", "jobs", *args, env=env,
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)  # fmt: skip
        out, _ = await process.communicate()
        return process.returncode or 0, out.decode().strip()

    async def replicas(n: int) -> set[str]:
        gpus = await serving(bootstrap, service)
        return gpus if len(gpus) == n else set()

    try:
        for s in services:
            await asyncio.wait_for(s.ready.wait(), 90)
        async with Publisher(bootstrap, source="test") as publisher:
            await publisher.publish_all(service_and_offline_job(service, offline, iterations=10**7))
        await eventually(lambda: replicas(2), timeout_s=90)

        # offline: the matcher places it beside the service; a lower SM share is applied by an adjust
        async def placed() -> list[Placement]:
            return [p for _, p in await read_all(bootstrap, PLACEMENTS) if isinstance(p, Placement) and p.job_id == offline and p.action == "place"]

        [placement, *_] = await eventually(placed, timeout_s=90)
        share = max(10.0, placement.sm_share / 2)
        code, out = await cli("resize", offline, "--sm-share", f"{share:g}", "--reason", "make room")
        assert code == 0 and out.startswith(f"{offline} resized: resized by tester: SM share {placement.sm_share:g} -> {share:g} %"), out
        adjusts = [c for _, c in await read_all(bootstrap, EXECUTOR_COMMANDS)
                   if isinstance(c, ExecutorCommand) and c.job_id == offline and c.action is CommandAction.ADJUST]  # fmt: skip
        assert [(c.node_id, c.sm_share) for c in adjusts] == [(placement.node_id, share)]
        code, out = await cli("resize", offline, "--memory-mib", "100000")
        assert code == 1 and "memory quota 100000 MiB does not fit" in out and "MiB free beside its online service" in out, out

        # online: up within vc-b's headroom (one serving node of 4 T4), refused past it, down; each
        # resize touches only the replicas it adds or removes (`cells.resize`)
        async def bindings() -> dict[str, list[tuple[str, tuple[str, ...]]]]:
            """pod -> its (state, GPUs) bindings in order."""
            out: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
            for _, b in await read_all(bootstrap, CELL_BINDINGS):
                if isinstance(b, CellBinding) and b.job_id == service and b.pod:
                    out.setdefault(b.pod, []).append((b.state, b.gpu_ids))
            return out

        async def commands() -> list[tuple[CommandAction, tuple[str, ...]]]:
            return [(c.action, c.gpu_ids) for _, c in await read_all(bootstrap, EXECUTOR_COMMANDS)
                    if isinstance(c, ExecutorCommand) and c.job_id == service]  # fmt: skip

        first = await bindings()
        assert sorted(first) == [f"{service}/0", f"{service}/1"] and all(len(v) == 1 for v in first.values())
        kept = {g for v in first.values() for _, gpus in v for g in gpus}
        assert await serving(bootstrap, service) == kept
        code, out = await cli("resize", service, "--replicas", "3")
        assert code == 0 and out.startswith(f"{service} resized: replicas 2 -> 3 by tester"), out
        three = await eventually(lambda: replicas(3), timeout_s=60)
        after_up = await bindings()
        assert {p: after_up[p] for p in first} == first  # the serving replicas' bindings are as they were
        [(state, added)] = after_up[f"{service}/2"]
        assert state == "bound" and three == kept | set(added)
        starts = sorted((CommandAction.START_ONLINE, gpus) for v in after_up.values() for _, gpus in v)
        assert sorted(await commands()) == starts  # one start per replica, ever; no stop
        code, out = await cli("resize", service, "--replicas", "6")
        assert (code, out) == (1, "Error: VC vc-b has 1 free guaranteed GPUs for 3 more replicas"), out
        code, out = await cli("resize", service, "--replicas", "2")
        assert code == 0 and "replicas 3 -> 2" in out, out
        assert await eventually(lambda: replicas(2), timeout_s=60) == kept  # the replica added last is the one removed
        after_down = await bindings()
        assert {p: after_down[p] for p in first} == first and after_down[f"{service}/2"][-1] == ("released", ())
        stops = [(action, gpus) for action, gpus in await commands() if action is not CommandAction.START_ONLINE]
        assert stops == [(CommandAction.STOP, added)]  # one stop, naming the removed replica's GPU; the others never restarted
        assert len([a for a, _ in await commands() if a is CommandAction.START_ONLINE]) == 3
        code, out = await cli("resize", service, "--sm-share", "50")
        assert code == 1 and "an online job's footprint is its replicas, not sm_share" in out, out
        resized = [(e.job_id, e.replicas, e.sm_share) for _, e in await read_all(bootstrap, JOBS_RESIZES) if isinstance(e, JobResized)]
        # Each job's resizes in order; the two jobs' records sit on their own partitions.
        assert sorted(resized, key=lambda r: r[0]) == sorted([(offline, None, share), (service, 3, None), (service, 2, None)], key=lambda r: r[0])

        async def history(job_id: str, text: str) -> str:
            code, out = await cli("history", job_id)
            return out if code == 0 and text in out else ""

        out = await eventually(lambda: history(service, "VC vc-b has 1 free guaranteed GPUs for 3 more replicas"), timeout_s=30)
        assert "replicas 2 -> 3" in out and "replicas 3 -> 2" in out, out
        await eventually(lambda: history(offline, "memory quota 100000 MiB does not fit"), timeout_s=30)
    finally:
        for s in services:
            s.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
