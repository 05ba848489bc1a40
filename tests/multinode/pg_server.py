"""A throwaway PostgreSQL server inside one host's namespace, for a study reached over the link.

The machine's own server listens on 127.0.0.1 in the root namespace, which no host of
``tests/multinode/netns.py`` can reach (by design: no route out). So a fresh cluster is made with ``initdb``
in a temporary directory owned by the ``postgres`` user and started inside the host's namespace, listening on
the host's address only, trusting connections from 198.18.0.0/15.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.multinode.netns import Host

PG_PORT = 5432


def pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that has ``initdb`` and ``postgres``, or ``None``."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]) if
                   p.parts[-3].isdigit() else 0)
    return found[-1].parent if found and (found[-1].parent / "postgres").exists() else None


def why_no_pg() -> str | None:
    """Why a server cannot be made here (a skip reason), or ``None``."""
    if pg_bin() is None:
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no `postgres` user to run initdb and the server as"
    if shutil.which("runuser") is None:
        return "no `runuser` to start the server as the postgres user"
    return None


class PgServer:
    """A server started by :meth:`start`; :meth:`stop` kills it and removes its directory (never raises)."""

    def __init__(self, host: Host):
        self.host = host
        self.dir = Path(tempfile.mkdtemp(prefix="dso-pg-"))
        self.proc: subprocess.Popen | None = None
        self.url = f"postgresql://postgres@{host.addr}:{PG_PORT}/postgres"

    def _as_postgres(self, *cmd: str) -> list[str]:
        return [*self.host.exec_prefix(), "runuser", "-u", "postgres", "--", *cmd]

    def start(self, timeout_s: float = 60) -> "PgServer":
        """``initdb`` (trust auth), then the server in the host's namespace; waits up to ``timeout_s`` seconds for
        it to accept connections. Raises ``RuntimeError`` with the server's log if it does not."""
        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        data = self.dir / "data"
        res = subprocess.run(self._as_postgres(str(pg_bin() / "initdb"), "-A", "trust", "-U", "postgres", "-D",
                                               str(data)), capture_output=True, text=True, timeout=timeout_s)
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed: {res.stderr[-2000:]}")
        with open(data / "pg_hba.conf", "a") as f:
            f.write("host all all 198.18.0.0/15 trust\n")
        log = open(self.dir / "server.log", "w")
        self.proc = subprocess.Popen(
            self._as_postgres(str(pg_bin() / "postgres"), "-D", str(data), "-p", str(PG_PORT), "-k", str(self.dir),
                              "-c", f"listen_addresses={self.host.addr}", "-c", "fsync=off"),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            ready = subprocess.run(self._as_postgres(str(pg_bin() / "pg_isready"), "-h", self.host.addr, "-p",
                                                     str(PG_PORT)), capture_output=True, timeout=10)
            if ready.returncode == 0:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        raise RuntimeError(f"the PostgreSQL server did not start:\n{(self.dir / 'server.log').read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.host.kill_all()  # the server's children (a forked backend outlives the killed postmaster briefly)
        shutil.rmtree(self.dir, ignore_errors=True)
