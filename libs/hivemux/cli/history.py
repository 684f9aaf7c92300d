"""What `hivemux up` does so that its embedded broker keeps its history (issue 16 item 4).

The embedded broker keeps topics in memory; `store.archive` copies every record into the
embedded PostgreSQL (its data in `<workdir>/infra`, kept across runs) and produces them back.
`History` is that for `up`:

- `restore()` when `up` starts on an existing work directory and whenever the supervised broker
  was started again, before any service runs against it: every topic back at the same offsets,
  the consumer groups' offsets back;
- `start()` / `stop()` the archiver, which runs in a thread of its own (its own event loop) so
  the supervisor keeps the main thread (the servers' parent-death signal needs it);
- `before_broker_restart(children)`: stop the archiver and SIGKILL the services, so nothing
  produces into the empty broker before it is restored (their records would take the offsets
  of the archived ones); the supervisor starts them again afterwards, and each rebuilds its
  state from the restored log (deciders fold from the start, group consumers resume from the
  restored offsets, the projector from its own stored positions, which the restore keeps valid).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..store.archive import ArchiveMismatch, ArchiveStats, RestoreReport, archive, restore, wait_archived
from ..topics import ALL_TOPICS

log = logging.getLogger("hivemux.up.history")


class History:
    def __init__(
        self,
        bootstrap_servers: str,
        dsn: str,
        *,
        topics: Sequence[str] | None = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topics = (
            list(topics) if topics is not None else [t.name for t in ALL_TOPICS]
        )
        self.dsn = dsn
        self.stats = ArchiveStats()
        self.restores: list[RestoreReport] = []
        self._say = say
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None

    def restore(self) -> RestoreReport:
        """Refill the broker (no service runs). When the projector had projected records the
        archive lacks (lost with the broker), the read models are emptied so the projector,
        started next, folds them again from the restored log (what `projector rebuild` does)."""
        report = asyncio.run(restore(self.bootstrap_servers, self.dsn))
        self.restores.append(report)
        self._say(f"history: {report.line()}")
        if report.projector_ahead:
            asyncio.run(_reset_read_models(self.dsn))
            self._say("history: read models emptied; the projector folds them again from the restored log")
        return report

    def start(self) -> None:
        if self._thread is not None:
            return
        ready = threading.Event()
        self._stop = None

        def run() -> None:
            async def main() -> None:
                self._loop = asyncio.get_running_loop()
                self._stop = asyncio.Event()
                ready.set()
                await archive(
                    self.bootstrap_servers,
                    self.dsn,
                    self.topics,
                    stop=self._stop,
                    stats=self.stats,
                )

            try:
                asyncio.run(main())
            except BaseException as error:
                if (
                    self._stop is not None and self._stop.is_set()
                ):  # stopping while the broker is down
                    log.info("archiver stopped: %s: %s", type(error).__name__, error)
                else:  # reported in the summary
                    self.error = error
                    log.exception("archiver stopped")
            finally:
                ready.set()

        self._thread = threading.Thread(
            target=run, name="hivemux-archiver", daemon=True
        )
        self._thread.start()
        ready.wait(10)

    def stop(self, timeout_s: float = 15.0, *, drain: bool = False) -> None:
        """Stop the archiver; with `drain` (a clean stop, the broker alive), once it has copied
        every record the broker holds (for at most `timeout_s`)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if drain and thread.is_alive():
            try:
                if not asyncio.run(
                    wait_archived(
                        self.bootstrap_servers,
                        self.dsn,
                        self.topics,
                        timeout_s=timeout_s,
                    )
                ):
                    log.warning(
                        "the archive did not catch up with the broker within %.0f s",
                        timeout_s,
                    )
            except Exception as error:
                log.warning("could not wait for the archive to catch up: %s", error)
        if (
            self._loop is not None
            and self._stop is not None
            and not self._loop.is_closed()
        ):
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop already ended
                pass
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("the archiver did not stop within %.0f s", timeout_s)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def before_broker_restart(self, children: Sequence[Any]) -> None:
        self.stop()
        running = [c for c in children if c.process.poll() is None]
        for child in running:
            child.process.send_signal(signal.SIGKILL)
        for child in running:
            child.process.wait()
        self._say(
            f"history: the broker died; archiver stopped and {len(running)} services stopped until it is restored"
        )

    def after_broker_restart(self, again: Callable[[], None] | None = None, attempts: int = 5) -> None:
        """Restore the restarted broker, then archive again. A client may write into the empty
        broker before its partition is restored (services are stopped, a user's `jobs submit` is
        not): the restore refuses (`ArchiveMismatch`) and, given `again` (kill the broker, start
        it empty, create the topics), is tried again up to `attempts` times; what that client
        wrote is lost with that broker, unarchived, which `jobs submit` notices and publishes
        again."""
        for attempt in range(1, attempts + 1):
            try:
                self.restore()
                break
            except ArchiveMismatch as error:
                if again is None or attempt == attempts:
                    raise
                self._say(f"history: {error}: a client wrote into the broker before it was restored; starting it again empty")
                again()
        self.start()
        self._say(
            "history: archiver running again; the supervisor starts the services, which rebuild from the restored log"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "archive": self.stats.summary(),
            "restores": [
                {
                    "records": r.records,
                    "partitions": r.partitions,
                    "groups": r.groups,
                    "seconds": round(r.seconds, 2),
                    "projector_ahead": r.projector_ahead,
                }  # fmt: skip
                for r in self.restores
            ],
            "archiver_error": None
            if self.error is None
            else f"{type(self.error).__name__}: {self.error}",
        }


async def _reset_read_models(dsn: str) -> None:
    import asyncpg

    from ..store.read_models import ReadModelStore

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        await ReadModelStore(pool).reset()
    finally:
        await pool.close()


def render_history(history: dict[str, Any]) -> str:
    """One line for the end-of-run summary: what was archived, how far behind, what was restored."""
    archive = history["archive"]
    text = (f"History: {archive['records']} records archived (lag mean {archive['lag_ms_mean']:.0f} ms, "
            f"max {archive['lag_ms_max']:.0f} ms)")  # fmt: skip
    for done in history["restores"]:
        if done["records"]:
            text += f"; {done['records']} restored in {done['seconds']:.1f} s"
    if history["archiver_error"]:
        text += f"; archiver stopped: {history['archiver_error']}"
    return text
