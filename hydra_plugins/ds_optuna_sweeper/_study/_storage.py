"""Where the study lives: the storage for a URL, and the lock of a worker's first contact with it.

RDB URLs (sqlite, postgresql, mysql) become a ``_retry.RetryingRDBStorage`` (an ``optuna.storages.RDBStorage``)
with Optuna's heartbeat; how trials of a dead or preempted worker are found and closed, and the heartbeat
itself, is :mod:`._abandon`.
"""
from __future__ import annotations

import contextlib
import logging
import random
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ._abandon import retry_callback
from ._storage_text import is_rdb_url, is_redis_url, is_transient, redact_url

log = logging.getLogger(__name__)

#: Advisory-lock key for a study's first contact on PostgreSQL (any 64-bit constant; shared by every
#: ds_optuna worker of a database, since schema creation is per database).
PG_LOCK_KEY = 0x64735F6F7074756E  # "ds_optun"


@contextlib.contextmanager
def first_contact_lock(url: str, *, timeout_s: float) -> Iterator[None]:
    """Serialise a worker's first contact with the storage at ``url`` across processes and machines, waiting at
    most ``timeout_s`` seconds for the lock.

    Creating the schema, creating or loading the study and queueing the warm starts are each
    check-then-insert sequences that workers started together raced on (case C17, optuna/optuna#820; case C30,
    optuna/optuna#3616). Under this lock they happen one worker at a time:

    - SQLite: ``filelock.FileLock`` (``flock`` on POSIX) on ``<database file>.lock`` beside the database
      (same machine, or a file system with working locks);
    - PostgreSQL: a session advisory lock (``pg_try_advisory_lock``) on a connection of its own;
    - MySQL/MariaDB: ``GET_LOCK``;
    - anything else (journal files lock themselves, a ``_target_`` storage): no lock.

    Raises:
        TimeoutError: if the lock is not free within ``timeout_s`` (names the lock).
        Whatever SQLAlchemy raises when the database cannot be reached (the caller words it).
    """
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()  # as is_rdb_url reads it
    if scheme == "sqlite":
        with _file_lock(url, timeout_s):
            yield
    elif scheme in ("postgresql", "postgres", "mysql"):
        with _database_lock(url, scheme, timeout_s):
            yield
    else:
        yield


@contextlib.contextmanager
def _file_lock(url: str, timeout_s: float) -> Iterator[None]:
    """``filelock.FileLock`` (``flock`` on POSIX) on ``<database file>.lock``; the file is left in place."""
    import filelock
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:":
        yield
        return
    path = Path(database).with_name(Path(database).name + ".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path), timeout=timeout_s)
    try:
        lock.acquire(poll_interval=0.05)
    except filelock.Timeout:
        raise TimeoutError(_held_too_long(timeout_s, f"the lock file {path}")) from None
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def _database_lock(url: str, scheme: str, timeout_s: float) -> Iterator[None]:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as conn:
            if scheme == "mysql":
                take = sqlalchemy.text("SELECT GET_LOCK('ds_optuna_first_contact', 0)")
                release = sqlalchemy.text("SELECT RELEASE_LOCK('ds_optuna_first_contact')")
            else:
                take = sqlalchemy.text(f"SELECT pg_try_advisory_lock({PG_LOCK_KEY})")
                release = sqlalchemy.text(f"SELECT pg_advisory_unlock({PG_LOCK_KEY})")
            _poll(lambda: bool(conn.execute(take).scalar()), timeout_s, f"the {scheme} lock of {redact_url(url)}")
            try:
                yield
            finally:
                _release(conn, release, url)
    finally:
        engine.dispose()


def _release(conn: Any, release: Any, url: str) -> None:
    """Release a first-contact lock; a lock whose connection dropped was released by the server with
    its session (PostgreSQL's session advisory locks, MySQL's ``GET_LOCK``), so that is only logged."""
    try:
        conn.execute(release)
        conn.commit()
    except Exception as e:
        if not is_transient(e):
            raise
        log.warning("The first-contact lock's connection to %s dropped during set-up; the server released "
                    "the lock with it (%s)", redact_url(url), type(e).__name__)


def _held_too_long(timeout_s: float, what: str) -> str:
    return (f"waited {timeout_s:g} s for {what}: another worker holds it while it opens the study; "
            "if none is running, a crashed worker's connection may still hold it")


def _poll(try_once: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Call ``try_once`` with jittered backoff (10 ms to 0.5 s) until it returns True or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while not try_once():
        if time.monotonic() >= deadline:
            raise TimeoutError(_held_too_long(timeout_s, what))
        time.sleep(delay * (0.5 + random.random()))
        delay = min(0.5, delay * 2)


def open_storage(
    url: str, *, heartbeat_interval_s: Optional[int], grace_period_s: Optional[int], max_retry: int,
    retry_timeout_s: float = 0.0,
) -> Any:
    """An Optuna storage for ``url``: for RDB URLs a :class:`~._retry.RetryingRDBStorage` (an ``RDBStorage`` whose
    transactions are retried through transient errors for up to ``retry_timeout_s``, case C35), for Redis URLs a
    ``JournalStorage``, else ``url``.

    Args:
        url: an SQLAlchemy URL (``sqlite:///...``, ``postgresql://...``), a Redis URL
            (``redis://host:port/db``, served by a ``JournalStorage`` over a ``JournalRedisBackend``, case
            C56), or any other string Optuna accepts as a storage (returned unchanged).
        heartbeat_interval_s: seconds between heartbeats of the running trial; ``None`` turns the
            heartbeat off.
        grace_period_s: seconds without heartbeat after which a RUNNING trial is stale; ``None``
            means Optuna's default (twice the interval).
        max_retry: how often an abandoned trial is re-queued with the same params (0: never).
        retry_timeout_s: seconds a storage outage may last before
            :class:`~._errors.StorageUnavailableError` (``Settings.storage_retry_budget_s``).

    Raises:
        ImportError: a Redis URL without the ``redis`` package, a PostgreSQL URL without its driver (the message
            names the ``redis`` or ``postgres`` extra).
        Whatever SQLAlchemy/Optuna/redis raise for an unreachable or malformed URL (the caller words it).
    """
    if is_redis_url(url):
        return journal_storage(_redis_backend(url))
    if not is_rdb_url(url):
        return url
    import optuna

    kwargs: dict[str, Any] = {}
    if heartbeat_interval_s:
        kwargs.update(heartbeat_interval=int(heartbeat_interval_s), grace_period=grace_period_s)
        callback = retry_callback(max_retry)
        if callback is not None:
            kwargs["heartbeat_stale_trial_callback"] = callback
    from ._retry import RetryingRDBStorage

    engine_kwargs = {"pool_pre_ping": True} if not url.startswith("sqlite") else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return RetryingRDBStorage(url, retry_timeout_s=retry_timeout_s, engine_kwargs=engine_kwargs, **kwargs)
        except ImportError as e:  # Optuna's "Failed to import DB access module" (a new user met psycopg's)
            if not url.startswith("postgresql"):
                raise
            raise ImportError(f"{redact_url(url)} needs a PostgreSQL driver (SQLAlchemy could not import it: {e}): "
                              "pip install 'hydra-ds-optuna-sweeper[postgres]'") from e


def _redis_backend(url: str) -> Any:
    """``JournalRedisBackend(url)``; its first command (``PING``) fails here when nobody answers at ``url``."""
    try:
        import redis  # Optuna imports it lazily and says less
    except ImportError as e:
        raise ImportError(f"{redact_url(url)} needs the 'redis' package: pip install 'hydra-ds-optuna-sweeper[redis]'") from e
    from optuna.storages.journal import JournalRedisBackend

    client = redis.Redis.from_url(url, socket_connect_timeout=10)
    try:
        client.ping()
    finally:
        client.close()
    import optuna

    with warnings.catch_warnings():  # Optuna marks it experimental; the README says what it does
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return JournalRedisBackend(url)


def journal_storage(opened: Any) -> Any:
    """``opened`` as an Optuna storage: a journal backend (any ``BaseJournalBackend``) is wrapped in
    ``JournalStorage`` (Optuna's journal storage documentation, case C56); anything else is returned unchanged."""
    import optuna
    from optuna.storages.journal import BaseJournalBackend

    if isinstance(opened, BaseJournalBackend):
        return optuna.storages.JournalStorage(opened)
    return opened
