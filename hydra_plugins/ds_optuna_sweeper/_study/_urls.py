"""Storage URLs as text: which storage a URL names (an RDB database, a Redis server) and how messages show it
(password hidden). Imports nothing of the package, so every module that names a storage may use it.
"""

from __future__ import annotations

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
