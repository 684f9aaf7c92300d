"""Web console benchmark (issue 17 item 3): how long the console takes to show a large cluster.

With benchmarks/api.py's read model (100,000 jobs, 10 history rows each, a tenth of them waiting,
400 GPUs) behind a real api service process, headless Debian Chromium (Playwright) opens
/console?token=... in a fresh context and the time is taken until the page has rendered every
GPU tile, the jobs table (first 500 jobs) and the VC cards with their queues, and the first chart
point. Median and max over repeats, as an admin (every VC; 10,000 waiting jobs in 4 queues, each
drawn to its first 50) and as a tenant (one VC, no queue); plus the bytes the page loaded.

Run: `python benchmarks/console.py [--jobs N] [--repeats R]` (`make bench`); starts the embedded
broker and PostgreSQL; needs /usr/bin/chromium (`make install`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from playwright.async_api import async_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api import seed, start_api, wait_healthy  # noqa: E402  (benchmarks/api.py: one read model for both)

from hivemux.bus import ensure_topics  # noqa: E402
from hivemux.infra import InfraSettings, embedded_infra, free_port  # noqa: E402
from hivemux.topics import ALL_TOPICS  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
RENDERED = """() => document.querySelectorAll('[data-gpu-id]').length >= 400 && document.querySelectorAll('tr[data-job-id]').length > 0
    && document.querySelectorAll('[data-vc]').length > 0 && !!document.querySelector('[data-series="queue"] [data-value]:not([data-value=""])')"""


async def load_times(url: str, token: str, repeats: int) -> dict[str, float]:
    times, sizes = [], []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        for _ in range(repeats + 1):  # the first warms the server's caches and prepared statements
            context = await browser.new_context(viewport={"width": 1500, "height": 1100})
            page = await context.new_page()
            loaded: list[int] = []
            page.on("response", lambda r: loaded.append(int(r.headers.get("content-length") or 0)))
            began = time.monotonic()
            await page.goto(f"{url}/console?token={token}")
            await page.wait_for_function(RENDERED, timeout=120_000, polling=50)
            times.append(time.monotonic() - began)
            sizes.append(sum(loaded))
            await context.close()
        await browser.close()
    times = times[1:]
    return {"median_ms": round(statistics.median(times) * 1000), "max_ms": round(max(times) * 1000), "bytes": max(sizes[1:])}


async def main(jobs: int, repeats: int) -> dict[str, object]:
    with embedded_infra(InfraSettings()) as infra, tempfile.TemporaryDirectory() as tmp:
        endpoints = infra.endpoints
        await ensure_topics(endpoints.bootstrap_servers, ALL_TOPICS)
        began = time.monotonic()
        dsn, admin, tenant = await seed(endpoints.postgres_dsn, jobs, 10)
        print(f"seeded {jobs:,} jobs, {10 * jobs:,} job events, 400 GPUs in {time.monotonic() - began:.0f} s", flush=True)
        port = free_port()
        log = Path(tmp) / "api.log"
        process = start_api(dsn, endpoints.bootstrap_servers, port, log)
        try:
            url = f"http://127.0.0.1:{port}"
            await wait_healthy(url, process, log)
            figures = {"admin": await load_times(url, admin, repeats), "tenant": await load_times(url, tenant, repeats)}
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    print(f"{'console load (to every tile, row, queue, chart)':<50} {'median ms':>10} {'max ms':>8} {'bytes':>10}")
    for who, f in figures.items():
        print(f"{who:<50} {f['median_ms']:>10} {f['max_ms']:>8} {f['bytes']:>10}")
    result = {"benchmark": "console", "jobs": jobs, "repeats": repeats, **figures}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.repeats))
