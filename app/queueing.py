"""Job transport: RQ on Redis when REDIS_URL is set, an in-process worker thread otherwise.

The queue only carries job ids. The store row is written before the enqueue and is the truth;
losing the queue (Redis restarted, process crashed) loses nothing, because the reconciler
(app.reconciler) re-enqueues every `queued` job the queue no longer holds. Workers claim a job
with a guarded UPDATE, so a job delivered twice still runs once.
"""

from __future__ import annotations

import queue as stdlib_queue
import threading
from datetime import UTC, timedelta
from typing import Protocol

import structlog

from core.entrypoints import EMBEDDED_JOB_FUNCTION, resolve
from core.rq_transport import enqueue_on
from core.settings import Settings
from core.store import Store
from core.tables import utcnow

log = structlog.get_logger(__name__)


class QueueUnavailable(RuntimeError):
    """The transport cannot be reached; jobs stay `queued` in the store until it can."""


class JobQueue(Protocol):
    """What the API and the reconciler need from a transport."""

    def enqueue(self, job_id: str) -> None: ...

    def remove(self, job_id: str) -> None: ...

    def holds(self, job_id: str) -> bool:
        """True while the transport will still deliver (or is delivering) this job."""
        ...

    def depth(self) -> int: ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


class RQQueue:
    """RQ on Redis; `prunecast worker` processes consume it."""

    def __init__(self, settings: Settings) -> None:
        from redis import Redis
        from rq import Queue

        self.settings = settings
        self.redis = Redis.from_url(
            settings.redis_url or "", socket_connect_timeout=2, socket_timeout=5, health_check_interval=30
        )
        self.queue = Queue(settings.queue_name, connection=self.redis)

    def enqueue(self, job_id: str) -> None:
        from redis.exceptions import RedisError

        try:
            enqueue_on(self.queue, job_id)
        except RedisError as error:
            raise QueueUnavailable(f"redis: {error}") from error

    def remove(self, job_id: str) -> None:
        from redis.exceptions import RedisError

        try:
            self.queue.remove(job_id)
        except RedisError as error:
            log.warning("could not remove job from redis queue", job_id=job_id, error=str(error))

    def holds(self, job_id: str) -> bool:
        from redis.exceptions import RedisError
        from rq.exceptions import NoSuchJobError
        from rq.job import Job, JobStatus

        try:
            rq_job = Job.fetch(job_id, connection=self.redis)
            status = rq_job.get_status(refresh=False)
            queued = status == JobStatus.QUEUED and job_id in self.queue.get_job_ids()
        except NoSuchJobError:
            return False
        except RedisError as error:
            raise QueueUnavailable(f"redis: {error}") from error
        if status == JobStatus.QUEUED:
            return queued
        if status in (JobStatus.SCHEDULED, JobStatus.DEFERRED):
            return True
        if status == JobStatus.STARTED and rq_job.started_at is not None:
            # A horse picked it up but never claimed it in the store: alive only for a while.
            started = rq_job.started_at
            age = utcnow() - (started if started.tzinfo else started.replace(tzinfo=UTC))
            return age < timedelta(seconds=self.settings.heartbeat_timeout_s)
        return False

    def depth(self) -> int:
        return int(self.queue.count)

    def ping(self) -> None:
        from redis.exceptions import RedisError

        try:
            self.redis.ping()
        except RedisError as error:
            raise QueueUnavailable(f"redis: {error}") from error

    def close(self) -> None:
        self.redis.close()


class ThreadQueue:
    """Embedded mode: a daemon thread runs the very same job function as an RQ worker.

    A thread cannot be killed, so when a job is taken over while its thread hangs (the reconciler
    retried it), that thread is retired: it takes no further job, and a fresh thread serves the
    queue, the retry included.
    """

    def __init__(self, store: Store, settings: Settings, *, start_worker: bool = True) -> None:
        self.store = store
        self.settings = settings
        self._pending: stdlib_queue.Queue[str | None] = stdlib_queue.Queue()
        self._waiting: set[str] = set()  # ids in _pending, not yet taken by a worker thread
        self._running: dict[threading.Thread, str] = {}  # worker thread -> the job it runs
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None  # the thread that takes new jobs
        if start_worker:
            with self._lock:
                self._start_worker()

    def _start_worker(self) -> None:
        """Start the thread that takes jobs from now on (call with the lock held)."""
        self._thread = threading.Thread(target=self._work, name="prunecast-worker", daemon=True)
        self._thread.start()

    def enqueue(self, job_id: str) -> None:
        with self._lock:
            if job_id in self._waiting:
                return
            self._waiting.add(job_id)
        self._pending.put(job_id)

    def remove(self, job_id: str) -> None:
        # The claim in the store fails for a canceled job, so a stale id in the queue is harmless.
        return None

    def holds(self, job_id: str) -> bool:
        with self._lock:
            current = self._running.get(self._thread) if self._thread is not None else None
            return job_id in self._waiting or job_id == current

    def depth(self) -> int:
        return self._pending.qsize()

    def ping(self) -> None:
        if self._thread is not None and not self._thread.is_alive():
            raise QueueUnavailable("the in-process worker thread has stopped")

    def close(self) -> None:
        if self._thread is not None:
            self._pending.put(None)
            self._thread.join(timeout=5)

    def _retire(self, thread: threading.Thread) -> None:
        """The job `thread` runs was taken over (its attempt superseded): let another thread serve."""
        with self._lock:
            if self._thread is not thread:
                return
            log.warning(
                "embedded worker: a superseded job still holds the worker thread; starting another",
                job_id=self._running.get(thread),
            )
            self._start_worker()

    def _work(self) -> None:
        execute_job = resolve(EMBEDDED_JOB_FUNCTION)  # the engine, imported in this thread only
        me = threading.current_thread()
        while self._thread is me:
            job_id = self._pending.get()
            if job_id is None:
                return
            with self._lock:
                self._waiting.discard(job_id)
                self._running[me] = job_id
            try:
                execute_job(self.store, self.settings, job_id, on_superseded=lambda: self._retire(me))
            except Exception:
                log.exception("embedded worker: job crashed outside its handler", job_id=job_id)
            finally:
                with self._lock:
                    self._running.pop(me, None)


def make_queue(settings: Settings, store: Store) -> JobQueue:
    if settings.redis_url:
        return RQQueue(settings)
    return ThreadQueue(store, settings, start_worker=settings.embedded_worker)
