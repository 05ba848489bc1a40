"""The first-contact lock of ``_study/_storage.py`` on SQLite (cases C17/C30: workers started together on a new
storage serialise schema creation, study creation and warm starts): a second process waits for it, gets it once
it is free, and past its timeout raises ``TimeoutError`` naming the lock file. The races themselves, many
launches at once, are ``tests/faults/test_start_up_races.py`` (soak)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hydra_plugins.ds_optuna_sweeper._study._storage import first_contact_lock

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import sys, time
from hydra_plugins.ds_optuna_sweeper._study._storage import first_contact_lock
print("waiting", flush=True)
start = time.monotonic()
try:
    with first_contact_lock(sys.argv[1], timeout_s=float(sys.argv[2])):
        print(f"got it after {time.monotonic() - start:.2f} s")
except TimeoutError as e:
    print(f"TimeoutError: {e}")
"""


def _child(url: str, timeout_s: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, url, str(timeout_s)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.timeout(60)
def test_a_second_process_waits_for_the_lock_and_times_out_naming_its_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'sub' / 'optuna.db'}"
    with first_contact_lock(url, timeout_s=5):
        out, _ = _child(url, 0.5).communicate(timeout=30)
        out = out.removeprefix("waiting\n")
        assert out.startswith("TimeoutError: waited 0.5 s for the lock file ") and \
            str(tmp_path / "sub" / "optuna.db.lock") in out and "another worker holds it" in out, out
        waiting = _child(url, 20)
        assert waiting.stdout.readline() == "waiting\n"  # imported, about to take the lock
        time.sleep(0.5)
        assert waiting.poll() is None, waiting.communicate()[0]  # still waiting while we hold it
    out, _ = waiting.communicate(timeout=30)
    assert out.startswith("got it after "), out
    with first_contact_lock(url, timeout_s=0.1):  # released by the child, taken again at once
        pass


def test_storages_without_a_file_or_server_lock_pass_through(tmp_path):
    for url in ("sqlite:///:memory:", "redis://127.0.0.1:1/0", str(tmp_path / "journal.log")):
        with first_contact_lock(url, timeout_s=0.0):
            pass
