"""A real TCP proxy in front of the test PostgreSQL server, to make storage outages on purpose (case C35).

The sweeper connects through :class:`PgProxy`; the server stays the real one. Outages are made with
real parts only:

- **cut**: ``pg_terminate_backend`` on the server for the connections tagged with this test's
  ``application_name`` (the storage URL's query parameter), so other tests' and other users'
  connections on the same server are never touched (:func:`terminate_tagged`);
- **down**: while the file :attr:`PgProxy.down_file` holds a ``time.time()`` in the future, the proxy
  accepts each new connection and closes it at once, as a server that is restarting or a network that
  drops does; connections made before keep working (so the admin cut, made directly, still reaches them);
- **lost answer**: :meth:`PgProxy.lose_commit_answer` lets the server commit the next transaction
  whose SQL contains a given text, then closes the client's connection instead of forwarding
  ``COMMIT``'s answer, so the client cannot know the commit happened.

The task side (``tests/apps/pg_cut.py``) writes the down file and calls :func:`terminate_tagged`, so a
task on rank 0 can cut the sweeper's own connections at a chosen point.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

#: PostgreSQL's CommandComplete message for COMMIT: 'C', int32 length 11, "COMMIT\\0".
COMMIT_COMPLETE = b"C\x00\x00\x00\x0bCOMMIT\x00"


def terminate_tagged(admin_url: str, application_name: str) -> int:
    """``pg_terminate_backend`` every connection of this database tagged ``application_name``.

    Args:
        admin_url: a libpq URL of the real server (not through the proxy).
        application_name: the tag the sweeper's storage URL sets.

    Returns:
        How many backends were terminated.
    """
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND application_name = %s",
            (application_name,),
        ).fetchone()
    return int(row[0]) if row else 0


def down(down_file: Path, seconds: float) -> None:
    """Make a proxy whose down file is ``down_file`` refuse new connections for ``seconds``."""
    tmp = down_file.with_name(down_file.name + ".tmp")
    tmp.write_text(repr(time.time() + seconds))
    tmp.replace(down_file)


class PgProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port`` on threads (one pair per connection).

    Args:
        target_host, target_port: the real PostgreSQL server.
        down_file: the file :func:`down` writes (need not exist).

    Attributes:
        port: the port to put in the storage URL.
        refused: connections closed at once while down.
        answers_lost: COMMIT answers dropped by :meth:`lose_next_commit_answer`.
    """

    def __init__(self, target_host: str, target_port: int, down_file: Path) -> None:
        self.target = (target_host, target_port)
        self.down_file = down_file
        self.refused = 0
        self.answers_lost = 0
        self._lose_commit = threading.Event()
        self._after: bytes | None = None
        self._closed = threading.Event()
        self._links: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="pg-proxy", daemon=True)
        self._thread.start()

    def is_down(self) -> bool:
        """True while the down file holds a time in the future."""
        try:
            return float(self.down_file.read_text()) > time.time()
        except (OSError, ValueError):
            return False

    def up(self) -> None:
        """End a 'down' period now."""
        self.down_file.unlink(missing_ok=True)

    def lose_commit_answer(self, after: bytes) -> None:
        """The ``COMMIT`` of the next transaction whose SQL contains ``after`` (e.g. ``b"INSERT INTO
        trials "``) is committed by the server, and its client's connection is closed before the answer
        reaches it (one-shot)."""
        self._after = after

    def close(self) -> None:
        """Stop accepting and close every forwarded connection."""
        self._closed.set()
        self._server.close()
        with self._lock:
            for a, b in self._links:
                _close(a)
                _close(b)
        self._thread.join(timeout=5)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.is_down():
                self.refused += 1
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._links.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not from_server and self._after is not None and self._after in data:
                    self._after = None
                    self._lose_commit.set()
                if from_server and COMMIT_COMPLETE in data and self._lose_commit.is_set():
                    self._lose_commit.clear()
                    self.answers_lost += 1
                    break  # the server committed; its answer never reaches the client
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def tear_down(proxy: PgProxy, study_name: str, storage_url: str) -> None:
    """A test's clean-up: let the proxy accept again, close it, and delete the test's study (if it was made)."""
    import optuna

    proxy.up()
    proxy.close()
    try:
        optuna.delete_study(study_name=study_name, storage=storage_url)
    except KeyError:
        pass
