"""The launch and its launcher: workers do not outlive a killed torchrun (C55). Real torchrun on CPU/gloo, real
SQLite studies; see docs in ``_comm/_launcher.py``.

One launch in ``make test``: the agent killed mid-trial with the workers under ``tests/apps/exit_record.py``'s
parent (which outlives the agent, so only the store's silence tells them: the arrival mark at the end of the
trial fails, ``_comm._launcher.stop_if_lost``); the same command then
finishes the study, run in process (resume counting is rank 0's). The other ways in are soak tests (``make
soak``): the worker as torchrun's own child (``PR_SET_PDEATHSIG``), the agent killed during set-up or while rank 0
writes the plots. A torchrun restart keeping the sweep dir (C50) is part of the kill -9 launch in
``tests/faults/test_faults.py``."""

import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.in_process import run_app
from tests.multirank.sweep_helpers import APP, exit_env, load
from tests.torchrun_utils import REPO, _tagged_pids, base_env, kill_tree, start_process, time_left, torchrun_command

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]

C, F, W, R = TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING, TrialState.RUNNING
#: Seconds every worker must be gone after torchrun's agent is killed (C55): the SIGTERM is at once;
#: rank 0 closes the trial and prints the resume command 2-4 s after the kill on this machine (the store
#: check probes for up to 2 s). The sweep alone would take 25 s more, so a worker that goes on is caught.
WORKERS_GONE_S = 15.0


def _sweep_cmd(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false",
            "hydra.sweeper.rank_timeout=30", "hydra.sweeper.n_trials=12", "x=interval(-1,1)", "sleep_s=2.0"]
    return torchrun_command(APP, args), base_env(DSO_RECORD_DIR=str(tmp_path / "records"))


def _wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > end:
            raise AssertionError(f"{path.name} never appeared\n{log.read_text()[-6000:]}")
        time.sleep(0.2)


def _kill_agent_once(mark: Path, proc: subprocess.Popen, log: Path) -> tuple[float, list[int], float]:
    """Wait for ``mark`` to appear, then ``kill -9`` the torchrun process ``proc`` (the agent, not a worker)
    and wait up to :data:`WORKERS_GONE_S` s for its workers to go. Returns ``(killed_at, pids left,
    seconds from the kill to the last worker's exit)``; the process tree is killed however it ends."""
    try:
        _wait_for(mark, proc, log, min(120.0, time_left() or 120.0))
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        end = time.monotonic() + WORKERS_GONE_S
        while _tagged_pids(proc.dso_tag) and time.monotonic() < end:
            time.sleep(0.2)
        return killed_at, _tagged_pids(proc.dso_tag), time.time() - killed_at
    finally:
        kill_tree(proc)


@pytest.mark.parametrize("recorded", [pytest.param(False, marks=pytest.mark.soak), True],
                         ids=["death-signal", "store-check"])
def test_c55_kill9_of_torchrun_stops_its_workers_and_the_same_command_resumes(tmp_path, recorded):
    """C55: ``kill -9`` of the torchrun process (the agent, not a worker) once trial 1 started: every worker
    is gone within :data:`WORKERS_GONE_S` seconds, no trial is left RUNNING (the one running is closed FAIL),
    no trial starts after the kill, rank 0 printed the resume command; the same command then finishes the
    study. ``death-signal``: the worker is torchrun's child (``PR_SET_PDEATHSIG``); ``store-check``: the
    worker runs under ``tests/apps/exit_record.py``'s parent, which outlives the agent, so only the
    store's silence tells it (its arrival mark at the end of the trial fails)."""
    cmd, env = _sweep_cmd(tmp_path)
    if recorded:
        env.update(exit_env(tmp_path))
    log = tmp_path / "torchrun.log"
    with open(log, "w") as out:
        proc = start_process(cmd, cwd=REPO, env=env, stdout=out)
    killed_at, left, gone_s = _kill_agent_once(tmp_path / "records" / "trial1_rank1.json", proc, log)
    output = log.read_text()
    assert not left, f"workers {left} outlived torchrun by {WORKERS_GONE_S} s\n{output[-6000:]}"
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert R not in states, (states, output[-6000:])
    assert F in states, (states, output[-6000:])
    assert all(t.datetime_start.timestamp() <= killed_at + 1.0 for t in study.trials if t.datetime_start), \
        ([t.datetime_start for t in study.trials], killed_at, output[-4000:])
    assert "Resume the study with:" in output, output[-6000:]
    assert "torchrun's agent is gone" in output, output[-6000:]
    assert "are no longer checked" not in output, output[-6000:]
    states_at_kill = states
    print(f"workers gone {gone_s:.1f} s after kill -9 of torchrun; states {[s.name for s in states]}")
    # The same command resumes: the closed trial counts in n_trials (FAIL, no retry asked); the rest run (in
    # process: what the resume counts is rank 0's alone; the trials' 2 s sleeps dropped).
    args = cmd[cmd.index(APP if os.path.isabs(APP) else str(REPO / APP)) + 1:]
    res = run_app("sweep_app", [a if not a.startswith("sleep_s=") else "sleep_s=0" for a in args], config_name="app",
                  env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()
    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    states = [t.state for t in study.trials]
    before = len(states_at_kill)
    assert states[:before] == states_at_kill and states[before:] == [C] * (12 - before), (states, res.output[-4000:])


@pytest.mark.soak
@pytest.mark.parametrize("when", ["set-up", "end"])
def test_c55_kill9_of_torchrun_during_set_up_or_the_end_of_the_sweep(tmp_path, when):
    """C55, the same kind: torchrun's agent killed while rank 0 opens the study (``set-up``: as soon as the
    study's SQLite file exists) or while it writes the plots after the last trial (``end``: once
    ``optimization_results.yaml`` exists, plots on). Every worker is gone within :data:`WORKERS_GONE_S` s,
    no trial is left RUNNING; at the end rank 0 still finishes the plots (every trial was told)."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30", "x=interval(-1,1)",
            f"hydra.sweeper.n_trials={6 if when == 'set-up' else 2}", "sleep_s=1.0"]
    if when == "set-up":
        args.insert(1, "hydra.sweeper.plots=false")
    cmd = torchrun_command(APP, args)
    log = tmp_path / "torchrun.log"
    with open(log, "w") as out:
        proc = start_process(cmd, cwd=REPO, env=base_env(DSO_RECORD_DIR=str(tmp_path / "records")), stdout=out)
    mark = tmp_path / "sweep" / ("optuna.db" if when == "set-up" else "optimization_results.yaml")
    killed_at, left, _ = _kill_agent_once(mark, proc, log)
    output = log.read_text()
    assert not left, f"workers {left} outlived torchrun by {WORKERS_GONE_S} s\n{output[-6000:]}"
    try:
        trials = load(tmp_path).trials
    except KeyError:  # killed before rank 0 created the study in the new SQLite file
        trials = []
    assert R not in [t.state for t in trials], output[-6000:]
    assert all(t.datetime_start.timestamp() <= killed_at + 1.0 for t in trials if t.datetime_start)
    if when == "end":
        assert [t.state for t in trials] == [C, C], output[-6000:]
        assert list((tmp_path / "sweep" / "plots").glob("*.html")), output[-6000:]
