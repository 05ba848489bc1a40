"""The process-lifetime rule of ``tests/torchrun_utils.py`` (issue 10, item 5), checked for real.

- A test's runs share one deadline, its pytest timeout minus a margin (set by ``tests/conftest.py``).
- Whatever way a run ends (our timeout, pytest-timeout raising inside the wait), every process it
  started is killed: torchrun *and its ranks*, which torchrun starts in sessions of their own, so
  killing torchrun's process group alone leaves them running.
"""

import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import torchrun_utils
from tests.conftest import deadline_margin_s
from tests.torchrun_utils import REPO, base_env, kill_tree, run_command, start_process, torchrun_command

SLEEPER = "tests/apps/sleeper.py"


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pid_files(record_dir: Path, nproc: int = 2) -> list[Path]:
    """The pid files ``tests/apps/sleeper.py``'s ranks 0..nproc-1 write into ``record_dir``."""
    return [record_dir / f"pid_rank{r}.txt" for r in range(nproc)]


def _ranks_started(record_dir: Path, nproc: int = 2) -> bool:
    """True once every rank of the sleeper wrote its pid file (written whole: a short text file)."""
    return all(f.exists() and f.read_text().strip() for f in _pid_files(record_dir, nproc))


def _rank_pids(record_dir: Path, nproc: int = 2) -> list[int]:
    files = _pid_files(record_dir, nproc)
    assert all(f.exists() for f in files), f"the ranks did not start: {sorted(p.name for p in record_dir.glob('*'))}"
    return [int(f.read_text()) for f in files]


def _wait_for_ranks(record_dir: Path, proc, within_s: float) -> None:
    """Wait until both ranks wrote their pid files, at most ``within_s`` seconds.

    Raises:
        AssertionError: ``proc`` ended first, or the files are still missing after ``within_s`` s.
    """
    end = time.monotonic() + within_s
    while not _ranks_started(record_dir):
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before its ranks started"
        assert time.monotonic() < end, f"the ranks did not start within {within_s:g} s"
        time.sleep(0.1)


def _gone(pids: list[int], within_s: float = 5.0) -> list[int]:
    """The pids still alive after ``within_s`` seconds."""
    end = time.monotonic() + within_s
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.timeout(77)
def test_each_test_gets_its_pytest_timeout_minus_a_margin_as_deadline():
    left = torchrun_utils.time_left()
    assert left is not None and 77 - deadline_margin_s(77) - 5 < left <= 77 - deadline_margin_s(77)
    assert torchrun_utils.allowed_seconds(150) == pytest.approx(left, abs=1)
    assert torchrun_utils.allowed_seconds(5) == 5


def test_a_spent_deadline_refuses_to_start_a_run():
    torchrun_utils.set_deadline(torchrun_utils.MIN_RUN_S - 1, "made up for this test")
    with pytest.raises(AssertionError, match="deadline .made up for this test. leaves"):
        torchrun_utils.run_python(SLEEPER, ["0"], timeout_s=60)


@pytest.mark.torchrun
@pytest.mark.timeout(90)
def test_our_timeout_kills_torchrun_and_every_rank(tmp_path):
    # The 3 s count from the moment both ranks run (their pid files), so a slow start cannot make our
    # timeout fire before there are ranks to kill; the start has its own 45 s.
    with pytest.raises(AssertionError, match="timed out after 3 s"):
        run_command(torchrun_command(SLEEPER, []), timeout_s=3, cwd=REPO,
                    env=base_env(DSO_RECORD_DIR=str(tmp_path)), started=lambda: _ranks_started(tmp_path),
                    start_timeout_s=45)
    assert _gone(_rank_pids(tmp_path)) == []


@pytest.mark.torchrun
@pytest.mark.timeout(150)
def test_pytest_timeout_firing_inside_the_wait_kills_torchrun_and_every_rank(tmp_path):
    """An inner pytest whose own timeout (signal method: it raises inside ``communicate``) fires while
    ``run_torchrun`` waits on two hung ranks with a far longer ``timeout_s``. The timeout is brought forward
    to half a second after both ranks run (a thread re-arms pytest-timeout's own alarm), so the test waits
    for no fixed time while the start, however slow, happens before it fires."""
    pids = tmp_path / "pids"
    inner = tmp_path / "test_inner.py"
    inner.write_text(textwrap.dedent(f"""
        import signal
        import threading
        import time
        from pathlib import Path

        import pytest
        from tests.torchrun_utils import run_torchrun

        PIDS = [Path({str(pids)!r}) / f"pid_rank{{r}}.txt" for r in range(2)]


        def _fire_once_the_ranks_run():
            while not all(p.exists() and p.read_text().strip() for p in PIDS):
                time.sleep(0.1)
            signal.setitimer(signal.ITIMER_REAL, 0.5)  # pytest-timeout's alarm, due now


        @pytest.mark.timeout(120, method="signal")
        def test_hangs():
            threading.Thread(target=_fire_once_the_ranks_run, daemon=True).start()
            run_torchrun({SLEEPER!r}, [], timeout_s=600, extra_env={{"DSO_RECORD_DIR": {str(pids)!r}}})
    """))
    log = tmp_path / "inner.log"
    with open(log, "w") as out:
        proc = start_process([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(inner)],
                             cwd=tmp_path, env=base_env(PYTHONPATH=str(REPO)), stdout=out)
    try:
        # The start (inner pytest, torchrun, two interpreters) has its own deadline; the inner timeout
        # fires half a second after the ranks run, while they are hung in the wait.
        _wait_for_ranks(pids, proc, within_s=60)
        rc = proc.wait(timeout=60)
        # Checked before this test's own clean-up, which would kill the ranks too (they carry its tag).
        still_running = _gone(_rank_pids(pids))
    finally:
        kill_tree(proc)
    assert rc != 0 and "Timeout" in log.read_text(), log.read_text()[-3000:]
    assert still_running == []
