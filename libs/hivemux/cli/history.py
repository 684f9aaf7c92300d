"""What `hivemux up` does so that its embedded broker keeps its history (issue 16 item 4).

The embedded broker keeps topics in memory; `store.archive` copies every record into the
embedded PostgreSQL (its data in `<workdir>/infra`, kept across runs) and produces them back.
`History` is that for `up`:

- `restore()` when `up` starts on an existing work directory and whenever the supervised broker
  was started again, before any service runs against it: every topic back at the same offsets,
  the consumer groups' offsets back;
- `start()` / `stop()` the archiver, which runs in a thread of its own (its own event loop) so
  the supervisor keeps the main thread (the servers' parent-death signal needs it). It is a
  supervised unit: on any error (the database restarted, the broker away, a bug) it is started
  again after a delay that doubles from 0.2 s up to 5 s (the supervisor's `Backoff`; a run of
  30 s resets it), never given up on, each stop and restart said (`say`) and logged. Beside it,
  `store.archive_watch.watch_archive` measures how far the archive is behind the broker every
  second and writes it, with the archiver's state, restarts and last error, into the database
  (the API's `/healthz`, `hivemux status` and the console read it there); `health()` is the
  same in this process;
- `before_broker_restart(children)`: stop the archiver and SIGKILL the services, so nothing
  produces into the empty broker before it is restored (their records would take the offsets
  of the archived ones); the supervisor starts them again afterwards, and each rebuilds its
  state from the restored log (deciders fold from the start, group consumers resume from the
  restored offsets, the projector from its own stored positions, which the restore keeps valid).
  What the dead broker held past the archive (the last ends the watch saw) is what the refill
  loses: `restore()` says it, topic by topic with offsets, before the services run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..settings import BusSettings
from ..store.archive import ArchiveMismatch, ArchiveStats, RestoreReport, archive, restore, wait_archived
from ..store.archive_watch import ARCHIVING, PAUSED, RESTARTING, ArchiverHealth, describe_gaps, watch_archive
from ..topics import ALL_TOPICS
from .supervisor import Backoff, RestartPolicy

# Never given up on: the database may be away for long; a restart every 5 s at most costs nothing.
ARCHIVER_RESTARTS = RestartPolicy(first_delay_s=0.2, max_delay_s=5.0, healthy_after_s=30.0, crash_loop_exits=sys.maxsize)

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
        self.error: BaseException | None = None  # the last error the archiver stopped on
        self.restarts = 0
        self._state = PAUSED
        self._error_at: float | None = None
        self._failed_run = -1  # `stats.runs` when the archiver last stopped on an error
        self._health = ArchiverHealth(PAUSED)  # the watch's last sample (replaced, never mutated)
        self._caught_up = True  # said once when the archive holds everything again after a restart

    def restore(self) -> RestoreReport:
        """Refill the broker (no service runs). When the projector had projected records the
        archive lacks (lost with the broker), the read models are emptied so the projector,
        started next, folds them again from the restored log (what `projector rebuild` does)."""
        report = asyncio.run(restore(self.bootstrap_servers, self.dsn, known_ends=self._health.ends))
        self.restores.append(report)
        self._say(f"history: {report.line()}")
        if report.lost:
            log.warning("the broker was refilled from an archive behind it: lost %s", describe_gaps(report.lost))
        self._health = ArchiverHealth(PAUSED, self.restarts, self._last_error(), self._error_at)  # a new broker: its ends are new
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
                await asyncio.gather(self._supervised(self._stop), watch_archive(
                    self.bootstrap_servers, self.dsn, self.topics, stop=self._stop, archived=lambda: self.stats.positions,
                    status=lambda: (self._current_state(), self.restarts, self._last_error(), self._error_at), report=self._watched,
                ))  # fmt: skip

            try:
                asyncio.run(main())
            except BaseException:  # not the archiver's errors (`_supervised` restarts it on those): a bug here
                log.exception("archiver thread stopped")
            finally:
                self._state = PAUSED
                ready.set()

        self._thread = threading.Thread(
            target=run, name="hivemux-archiver", daemon=True
        )
        self._thread.start()
        ready.wait(10)

    async def _supervised(self, stop: asyncio.Event) -> None:
        """Run the archiver until `stop`, starting it again with backoff whatever it stops on."""
        backoff = Backoff(ARCHIVER_RESTARTS)
        self._state = ARCHIVING
        while not stop.is_set():
            started = time.monotonic()
            try:
                # the services' fetch wait: the embedded broker answers an idle fetch only when
                # it expires, so a shorter one only polls all topics more often
                await archive(self.bootstrap_servers, self.dsn, self.topics, stop=stop, stats=self.stats,
                              fetch_max_wait_ms=BusSettings().fetch_max_wait_ms)
                if stop.is_set():
                    return
                raise RuntimeError("the archiver returned without being stopped")
            except Exception as error:
                if stop.is_set():  # stopping while the broker is down
                    log.info("archiver stopped: %s: %s", type(error).__name__, error)
                    return
                self.error, self._error_at, self._state = error, time.time(), RESTARTING
                self._failed_run = self.stats.runs
                self.restarts += 1
                self._caught_up = False
                delay = backoff.after_exit(time.monotonic() - started) or ARCHIVER_RESTARTS.max_delay_s
                behind = self._health.lag_records
                self._say(f"history: archiver stopped: {self._last_error()}; restart {self.restarts} in {delay:.1f} s"
                          + (f" (the archive is {behind} records behind the broker: lost if the broker dies before it catches up)" if behind else ""))  # fmt: skip
                log.warning("archiver stopped on %s (restart %d in %.1f s)", self._last_error(), self.restarts, delay)
                log.debug("archiver error", exc_info=error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)

    def _watched(self, health: ArchiverHealth) -> None:
        self._health = health
        if not self._caught_up and health.state == ARCHIVING and health.lag_records == 0:
            self._caught_up = True
            self._say(f"history: archiver running again after restart {self.restarts}; the archive holds everything the broker does")

    def _current_state(self) -> str:
        """RESTARTING from an error until a new run has connected and read its positions."""
        if self._state == RESTARTING and self.stats.runs > self._failed_run:
            return ARCHIVING
        return self._state

    def _last_error(self) -> str | None:
        return None if self.error is None else f"{type(self.error).__name__}: {self.error}"[:500]

    def health(self) -> dict[str, Any]:
        """The archiver's state and lag as this process last measured them (`ArchiverHealth.as_dict`)."""
        return self._health.as_dict()

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

    def lost_if_broker_died(self) -> str | None:
        """What the archive lacks of what the broker listed last ('N records: topic[p] offsets a-b, ...')."""
        return describe_gaps(self._health.behind) if self._health.behind else None

    def before_broker_restart(self, children: Sequence[Any]) -> None:
        self.stop()
        if (lost := self.lost_if_broker_died()) is not None:
            self._say(f"history: the broker died while the archive was behind it: the refill loses {lost}")
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
                    "lost": [{"topic": g.topic, "partition": g.partition, "first": g.first, "end": g.end} for g in r.lost],
                }  # fmt: skip
                for r in self.restores
            ],
            "archiver_error": self._last_error(),
            "archiver_restarts": self.restarts,
            "archiver": self.health(),
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
        if done.get("lost"):
            text += f" ({sum(g['end'] - g['first'] for g in done['lost'])} records LOST: the broker held them, the archive did not)"
    if history.get("archiver_restarts"):
        text += f"; archiver restarted {history['archiver_restarts']} times, last on {history['archiver_error']}"
    elif history["archiver_error"]:
        text += f"; archiver stopped: {history['archiver_error']}"
    return text
