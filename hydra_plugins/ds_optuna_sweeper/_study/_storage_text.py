"""The storage as text: which storage a URL names (an RDB database, a Redis server) and how messages show it
(password hidden); which database errors are transient (case C35), the classification the storage retries rely
on, and the one line that names a database error in a log.

:func:`is_transient` tells an error that waiting and reconnecting can fix (a terminated backend, a server
restarting, a lock held too long) from one that repeats forever (an integrity error, a bad value, a wrong
password). Imports nothing of the package but its errors; SQLAlchemy is imported inside functions.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from .._errors import StorageUnavailableError

RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "oracle", "mssql")
#: URL schemes of a Redis server, served by Optuna's ``JournalStorage(JournalRedisBackend(url))`` (case C56).
REDIS_SCHEMES = ("redis", "rediss")


def is_rdb_url(url: str) -> bool:
    """True for an SQLAlchemy URL of a database Optuna's ``RDBStorage`` serves (``sqlite:///``, ``postgresql://``...)."""
    return url.split(":", 1)[0].split("+", 1)[0].lower() in RDB_SCHEMES


def is_redis_url(url: str) -> bool:
    """True for a Redis URL (``redis://host:port/db``, ``rediss://`` with TLS), as ``redis.Redis.from_url`` reads it."""
    return url.split(":", 1)[0].lower() in REDIS_SCHEMES


def redact_url(url: str) -> str:
    """``url`` with its password hidden, for logs and messages (``postgresql://u:***@h/db``), by SQLAlchemy's
    ``make_url(url).render_as_string(hide_password=True)``; text that is no such URL is returned unchanged."""
    if not is_rdb_url(url) and not is_redis_url(url):
        return url
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not parseable: say nothing about its parts
        return url.split("://", 1)[0] + "://<unparseable URL>"


#: PostgreSQL SQLSTATEs worth a retry besides class 08 (connection exception): admin_shutdown
#: (pg_terminate_backend), crash_shutdown, cannot_connect_now (starting up), too_many_connections,
#: serialization_failure, deadlock_detected (PostgreSQL documentation, Appendix A).
PG_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300", "40001", "40P01"})
#: MySQL/MariaDB error numbers worth a retry: too many connections (1040), lock wait timeout (1205),
#: deadlock (1213), can't connect (2002, 2003), server has gone away (2006), lost connection (2013,
#: 2055). Untested here: no MySQL server in CI.
MYSQL_TRANSIENT_CODES = frozenset({1040, 1205, 1213, 2002, 2003, 2006, 2013, 2055})
#: SQLite primary result codes worth a retry: SQLITE_BUSY (5), SQLITE_LOCKED (6).
SQLITE_TRANSIENT_CODES = frozenset({5, 6})
#: Text of connection errors that come without a code and that waiting does not fix.
PERMANENT_TEXT = ("password authentication failed", "does not exist", "no pg_hba.conf entry",
                  "authentication failed", "permission denied", "invalid dsn", "ssl is required")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its causes and contexts (Optuna wraps SQLAlchemy's errors in ``StorageInternalError``)."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a database error that waiting and reconnecting can fix. The first
    SQLAlchemy error in the chain decides:

    - ``IntegrityError`` and every error that is not an ``OperationalError``/``InterfaceError``
      (``ProgrammingError``, ``DataError``...): never;
    - ``DisconnectionError``, or an error SQLAlchemy marked ``connection_invalidated`` (its dialect's
      ``is_disconnect``): always;
    - ``OperationalError``/``InterfaceError``: by the driver's code: PostgreSQL SQLSTATE class 08 or
      :data:`PG_TRANSIENT_SQLSTATES`, :data:`MYSQL_TRANSIENT_CODES`, :data:`SQLITE_TRANSIENT_CODES`
      (or SQLite's "database is locked" text); without a code (a refused, reset or closed connection),
      yes unless the text is one of :data:`PERMANENT_TEXT`.

    An error with no SQLAlchemy error in its chain (``ValueError``, ``KeyError``, Optuna's
    ``UpdateFinishedTrialError``, :class:`StorageUnavailableError`) is not transient.
    """
    from sqlalchemy import exc as sa_exc

    for error in _chain(exc):
        if isinstance(error, StorageUnavailableError):
            return False
        if isinstance(error, sa_exc.DisconnectionError):
            return True
        if isinstance(error, sa_exc.IntegrityError):
            return False
        if isinstance(error, sa_exc.DBAPIError):
            if error.connection_invalidated:
                return True
            if isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError)):
                return _transient_driver_error(error.orig)
            return False
    return False


def _transient_driver_error(orig: Any) -> bool:
    """Classify the DBAPI driver's own exception (see :func:`is_transient`)."""
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)  # psycopg 3 / psycopg2
    if sqlstate:
        return str(sqlstate).startswith("08") or str(sqlstate) in PG_TRANSIENT_SQLSTATES
    text = str(orig).lower()
    sqlite_code = getattr(orig, "sqlite_errorcode", None)
    if sqlite_code is not None:
        return (int(sqlite_code) & 0xFF) in SQLITE_TRANSIENT_CODES
    if type(orig).__module__.startswith("sqlite3"):
        return "database is locked" in text or "database table is locked" in text
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):  # pymysql, mysqlclient: (errno, message)
        return args[0] in MYSQL_TRANSIENT_CODES
    return not any(p in text for p in PERMANENT_TEXT)


def first_line(exc: BaseException) -> str:
    """``'<type>: <first line>'`` of the database error behind ``exc`` (Optuna's wrapper says nothing)."""
    cause = next((e for e in _chain(exc) if "sqlalchemy" in type(e).__module__), exc)
    text = str(getattr(cause, "orig", None) or cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"
