"""Owner locks: which RUNNING trials still have a live launch behind them (rank 0; case C54).

A launch killed with SIGKILL leaves its trial RUNNING, and Optuna's heartbeat (RDB storages only) waits out
``grace_period`` (optuna/optuna#5138, #6283). So rank 0 of every launch holds an *owner lock* named by its launch id
(:func:`launch_id`) while its process lives and records that id on each trial it asks (:data:`._stored.OWNER_ATTR`);
the operating system or the server drops the lock with the process, so a later launch closes a RUNNING trial whose
owner lock is free at once (:func:`close_orphans`), as for a crash. SQLite and journal files, PostgreSQL and
Redis have owner locks (:func:`lock_for`); on anything else (MySQL, in-memory) trials carry no owner record and
keep the heartbeat + ``grace_period`` rule (:mod:`._abandon`), as do trials of older studies.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import Any, Optional

from .. import _upstream as upstream
from ._abandon import abandon
from ._stored import OWNER_ATTR, RETRY_HISTORY_ATTR
from ._storage_text import redact_url

#: _storage's logger, where the sweeper's storage lines are logged (tests and users filter by it).
log = logging.getLogger(__package__ + "._storage")

_LAUNCH_ID: Optional[str] = None
#: The locks this process holds, by storage location (kept until the process exits).
_HELD: dict[str, "OwnerLock"] = {}


def launch_id() -> str:
    """This process's launch id: ``<host>-<pid>-<6 random hex digits>``, made once per process."""
    global _LAUNCH_ID
    if _LAUNCH_ID is None:
        _LAUNCH_ID = f"{socket.gethostname().split('.')[0]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return _LAUNCH_ID


class OwnerLock:
    """A lock per launch on one storage, at ``where`` (for messages: a file path, or a URL without its password).
    Subclasses implement :meth:`hold`, :meth:`is_held`, :meth:`release`."""

    def __init__(self, where: str) -> None:
        self.where = where

    def hold(self, owner: str) -> None:
        """Take the lock of ``owner`` (this process's launch id) and keep it until :meth:`release`."""
        raise NotImplementedError

    def is_held(self, owner: str) -> bool:
        """True while some live process holds the lock of ``owner`` (this one included)."""
        raise NotImplementedError

    def release(self) -> None:
        """Give the lock back (it also goes with the process)."""
        raise NotImplementedError


class FileOwnerLock(OwnerLock):
    """``fcntl.flock`` on ``<dir>/.<name>.owner-<owner>`` for a storage file ``<dir>/<name>`` (a hidden file, not a
    directory: the sweep dir's listings of job dirs do not change)."""

    def __init__(self, storage_file: str) -> None:
        super().__init__(storage_file)
        path = Path(storage_file).absolute()
        self.dir = path.parent
        self.prefix = f".{path.name}.owner-"
        self._f: Any = None

    def path(self, owner: str) -> Path:
        """The lock file of ``owner``."""
        return self.dir / f"{self.prefix}{owner}"

    def hold(self, owner: str) -> None:
        import fcntl

        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(f"{self.prefix}*"):  # files of launches that ended (is_held removes a free one)
            if stale.name != self.path(owner).name:
                self.is_held(stale.name[len(self.prefix):])
        self._f = open(self.path(owner), "a")
        fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # our own new name: never taken

    def is_held(self, owner: str) -> bool:
        import fcntl

        path = self.path(owner)
        if self._f is not None and Path(self._f.name) == path:
            return True
        try:
            f = open(path, "r")
        except FileNotFoundError:
            return False
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            path.unlink(missing_ok=True)  # a dead owner's file (still locked by us: no one re-takes it meanwhile)
            fcntl.flock(f, fcntl.LOCK_UN)
        return False

    def release(self) -> None:
        if self._f is not None:
            Path(self._f.name).unlink(missing_ok=True)
            self._f.close()
            self._f = None


def pg_key(owner: str) -> int:
    """The signed 64-bit advisory-lock key of ``owner`` (the first 8 bytes of ``sha256("ds_optuna_owner:" + owner)``)."""
    return int.from_bytes(hashlib.sha256(f"ds_optuna_owner:{owner}".encode()).digest()[:8], "big", signed=True)


class PostgresOwnerLock(OwnerLock):
    """A session advisory lock (``pg_try_advisory_lock(pg_key(owner))``) on a connection held open."""

    def __init__(self, url: str) -> None:
        super().__init__(redact_url(url))
        self.url = url
        self._engine: Any = None
        self._conn: Any = None

    def _new_engine(self) -> Any:
        import sqlalchemy

        return sqlalchemy.create_engine(self.url, poolclass=sqlalchemy.pool.NullPool)

    def hold(self, owner: str) -> None:
        import sqlalchemy

        self._engine = self._new_engine()
        self._conn = self._engine.connect()
        if not self._conn.execute(sqlalchemy.text(f"SELECT pg_try_advisory_lock({pg_key(owner)})")).scalar():
            raise RuntimeError(f"the owner lock of launch {owner} on {self.where} is taken")
        self._conn.commit()

    def is_held(self, owner: str) -> bool:
        import sqlalchemy

        engine = self._new_engine()
        try:
            with engine.connect() as conn:  # another session: a session lock is re-entrant in its own
                free = bool(conn.execute(sqlalchemy.text(f"SELECT pg_try_advisory_lock({pg_key(owner)})")).scalar())
                if free:
                    conn.execute(sqlalchemy.text(f"SELECT pg_advisory_unlock({pg_key(owner)})"))
                conn.commit()
                return not free
        finally:
            engine.dispose()

    def release(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._engine is not None:
            self._engine.dispose()
        self._conn = self._engine = None


def redis_client_name(owner: str) -> str:
    """The Redis client name of ``owner``'s connection (``CLIENT SETNAME``)."""
    return f"ds_optuna_owner:{owner}"


class RedisOwnerLock(OwnerLock):
    """A Redis connection named :func:`redis_client_name` held open; its name is looked up with ``CLIENT LIST``."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url
        self._conn: Any = None

    def hold(self, owner: str) -> None:
        import redis

        self._conn = redis.Redis.from_url(self.url, client_name=redis_client_name(owner), single_connection_client=True)
        self._conn.ping()

    def is_held(self, owner: str) -> bool:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            return any(c.get("name") == redis_client_name(owner) for c in client.client_list())
        finally:
            client.close()

    def release(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def lock_for(storage: Any) -> Optional[OwnerLock]:
    """The owner lock that fits an Optuna storage: a :class:`FileOwnerLock` for an SQLite file or a
    ``JournalFileBackend``, a :class:`PostgresOwnerLock`, a :class:`RedisOwnerLock` for a ``JournalRedisBackend``;
    ``None`` for anything else."""
    kind, where = upstream.storage_location(storage)
    lock_class = {"sqlite": FileOwnerLock, "journal_file": FileOwnerLock, "postgresql": PostgresOwnerLock,
                  "redis": RedisOwnerLock}.get(kind)
    return lock_class(where) if lock_class is not None else None


def hold(study: Any) -> Optional[str]:
    """Take this launch's owner lock on the study's storage (once per storage and process); return this launch's
    id, to record on each trial it asks, or ``None`` when the storage has no owner lock. A lock that cannot be taken
    (the server refuses the connection) is logged as a warning, not raised."""
    lock = lock_for(upstream.study_storage(study))
    if lock is None:
        return None
    if lock.where not in _HELD:
        try:
            lock.hold(launch_id())
        except Exception as e:  # no owner lock: this launch's trials keep the heartbeat rule, as before
            log.warning("No owner lock on %s (%s: %s): if this launch is killed, its running trial stays RUNNING "
                        "until a heartbeat check closes it (grace_period)", lock.where, type(e).__name__,
                        str(e).splitlines()[0] if str(e) else "")
            lock.release()
            return None
        _HELD[lock.where] = lock
    return launch_id()


def held_owner(study: Any) -> Optional[str]:
    """This launch's id when it holds the owner lock of the study's storage (:func:`hold`), else ``None``."""
    lock = lock_for(upstream.study_storage(study))
    return launch_id() if lock is not None and lock.where in _HELD else None


def release_all() -> None:
    """Give back every owner lock this process holds (they also go with the process; called at exit)."""
    while _HELD:
        _HELD.popitem()[1].release()


atexit.register(release_all)


def record_owner(study: Any, trial: Any) -> None:
    """Store this launch's id on an asked trial (:data:`._stored.OWNER_ATTR`) when it holds an owner lock."""
    owner = held_owner(study)
    if owner is not None:
        upstream.set_trial_system_attr(study, trial, OWNER_ATTR, owner)


def orphans(study: Any) -> dict[int, str]:
    """``{number: owner}`` of the RUNNING trials whose recorded owner holds no lock (its launch is gone); trials
    without an owner record are not listed."""
    from optuna.trial import TrialState

    lock = lock_for(upstream.study_storage(study))
    if lock is None:
        return {}
    found: dict[int, str] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.system_attrs.get(OWNER_ATTR)
        if owner is None:
            continue
        if owner == launch_id() and lock.where in _HELD:
            continue
        try:
            alive = lock.is_held(str(owner))
        except Exception as e:  # cannot tell: leave it to the heartbeat rule
            log.warning("Cannot check the owner lock of trial %d (launch %s) on %s (%s); it stays RUNNING", t.number,
                        owner, lock.where, type(e).__name__)
            continue
        if not alive:
            found[t.number] = str(owner)
    return found


def close_orphans(study: Any, max_retry: int) -> list[int]:
    """Close the RUNNING trials of launches that are gone (:func:`orphans`) as for a crash: FAIL, and re-queued
    with the same params and checkpoint directory when ``max_retry`` (``retry_failed_trials``) allows. Logs one
    line per trial; returns the numbers closed."""
    found = orphans(study)
    if not found:
        return []
    closed = abandon(study, sorted(found), max_retry, "no live owner", say=False)  # said per trial below
    trials = study.get_trials(deepcopy=False)
    for number in closed:
        retries = [t.number for t in trials if number in t.system_attrs.get(RETRY_HISTORY_ATTR, ())]
        after = (f"re-queued as trial {retries[-1]} with the same params" if retries
                 else f"not re-queued (retry_failed_trials={max_retry})")
        log.warning("trial %d was RUNNING with no live owner (launch %s): closed FAIL and %s", number,
                    found[number], after)
    return closed
