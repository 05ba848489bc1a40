"""Failures on one rank at every phase, crashes, restarts and preemption, under real torchrun.

Each case asserts the study's trial states and counts afterwards. Timeouts are layered: the
sweep's rank_timeout (a few seconds here) < the torchrun subprocess timeout < pytest's timeout.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import APP, load, records, run_sweep
from tests.torchrun_utils import REPO, base_env

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]

C, F = TrialState.COMPLETE, TrialState.FAIL
BASE = ["hydra.sweeper.n_trials=3", "hydra.sweeper.max_failure_rate=1.0", "x=interval(-1,1)"]


def _states(tmp_path):
    return [t.state for t in load(tmp_path).trials]


def _detect_s(tmp_path, number):
    t = load(tmp_path).trials[number]
    return (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete else None


@pytest.mark.parametrize(
    "kind, phase, message",
    [
        ("raise", "before", "RuntimeError: injected failure on rank 1"),
        ("raise", "after", "RuntimeError: injected failure on rank 1"),
        ("return_nan", "after", "the task returned NaN"),
        ("text", "after", "the task returned 'not a number'"),
        ("none_return", "after", "the task returned None"),
    ],
)
def test_c06_c07_failure_on_rank1_is_agreed_and_the_sweep_goes_on(tmp_path, fault_record, kind, phase, message):
    # "before" with no collective after it: the other rank is not left waiting in the training group.
    collectives = 2 if phase == "after" else 0
    res = run_sweep(tmp_path, *BASE, f"fault.kind={kind}", f"fault.phase={phase}", "fault.rank=1",
                    "fault.trial=1", f"collectives={collectives}").check()
    assert _states(tmp_path) == [C, F, C]
    assert message in res.output
    assert "rank 1/2, trial 1 failed" in res.output or "rank 1: " in res.output
    fault_record(f"{kind} {phase} training on rank 1 -> FAIL, sweep went on", _detect_s(tmp_path, 1))


def test_c07_traceback_is_logged_with_rank_and_trial(tmp_path, fault_record):
    res = run_sweep(tmp_path, *BASE, "fault.kind=raise", "fault.rank=1", "fault.trial=0").check()
    assert "rank 1/2, trial 0 failed:\nTraceback (most recent call last)" in res.output
    assert 'in _inject\n    raise RuntimeError(f"injected failure on rank {RANK}")' in res.output
    fault_record("traceback logged", _detect_s(tmp_path, 0))


def test_c07_max_failure_rate_zero_exits_non_zero_on_every_rank(tmp_path, fault_record):
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "fault.kind=raise",
                    "fault.rank=1", "fault.trial=0")
    assert res.returncode != 0
    assert _states(tmp_path) == [F]
    # Both ranks raise the failure-rate error (torchrun reports every failed rank).
    assert res.output.count("TrialFailedError: 1 of 1 trials of this run failed") >= 2
    fault_record("max_failure_rate=0 -> every rank non-zero", _detect_s(tmp_path, 0))


def test_config_that_resolves_on_rank0_only_fails_the_trial(tmp_path, fault_record):
    res = run_sweep(tmp_path, *BASE, "+needs_env=${oc.env:DSO_RANK0_ONLY}").check()
    assert _states(tmp_path) == [F, F, F]
    assert "could not be resolved on rank 1" in res.output
    assert records(tmp_path) == {}
    fault_record("config resolution fails on rank 1 -> FAIL before the task", _detect_s(tmp_path, 0))


def test_rank1_failing_before_a_training_collective_releases_rank0_and_exits_for_restart(tmp_path, fault_record):
    t0 = time.monotonic()
    res = run_sweep(tmp_path, *BASE, "hydra.sweeper.rank_timeout=6", "fault.kind=raise", "fault.phase=before",
                    "fault.rank=1", "fault.trial=1", "collectives=3", timeout_s=120)
    took = time.monotonic() - t0
    assert res.returncode != 0
    assert "TrainingGroupBrokenError" in res.output
    assert "injected failure on rank 1" in res.output
    assert _states(tmp_path) == [C, F]
    assert took < 60
    fault_record("rank 0 stuck in a collective released after rank_timeout; group exits", _detect_s(tmp_path, 1))


def test_rank1_failing_before_a_collective_under_max_restarts_resumes(tmp_path, fault_record):
    res = run_sweep(tmp_path, *BASE, "hydra.sweeper.rank_timeout=6", "fault.kind=raise", "fault.phase=before",
                    "fault.rank=1", "fault.trial=1", "collectives=3", timeout_s=180,
                    torchrun_args=["--max-restarts", "1"]).check()
    assert _states(tmp_path) == [C, F, C]
    assert "TrainingGroupBrokenError" in res.output
    fault_record("same under --max-restarts 1 -> restarted, study complete", _detect_s(tmp_path, 1))


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
def test_systemexit_and_keyboardinterrupt_on_rank1_stop_every_rank(tmp_path, fault_record, kind):
    res = run_sweep(tmp_path, *BASE, f"fault.kind={kind}", "fault.rank=1", "fault.trial=1")
    assert res.returncode != 0
    assert _states(tmp_path) == [C, F]
    assert "trial 1 was interrupted" in res.output
    fault_record(f"{kind} on rank 1 -> FAIL, all ranks stop", _detect_s(tmp_path, 1))


def test_hang_on_rank1_ends_by_timeout_with_the_trial_closed(tmp_path, fault_record):
    t0 = time.monotonic()
    res = run_sweep(tmp_path, *BASE, "hydra.sweeper.rank_timeout=5", "fault.kind=hang", "fault.rank=1",
                    "fault.trial=1", timeout_s=120)
    assert res.returncode != 0
    assert "RankTimeoutError" in res.output and "trial 1's trial result" in res.output
    assert _states(tmp_path) == [C, F]
    assert time.monotonic() - t0 < 90
    fault_record("rank 1 hangs -> rank 0 gives up after 2 x rank_timeout, trial closed", _detect_s(tmp_path, 1))


@pytest.mark.parametrize("retry", [0, 1])
def test_c09_kill9_of_rank1_mid_trial_restarts_and_resumes(tmp_path, fault_record, retry):
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "fault.kind=kill9", "fault.rank=1",
                    "fault.trial=1", "collectives=2", "fault.phase=before", f"hydra.sweeper.retry_failed_trials={retry}",
                    timeout_s=180, torchrun_args=["--max-restarts", "1"]).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C, F, C, C]
    assert not any(t.state == TrialState.RUNNING for t in study.trials)
    assert "its torchrun group was restarted" in res.output or "SIGTERM" in res.output
    if retry:
        assert study.trials[2].params == study.trials[1].params
        assert study.trials[2].system_attrs.get("failed_trial") == 1
    else:
        assert study.trials[2].params != study.trials[1].params
    # Job dirs are never reused: one per trial number.
    assert sorted(int(p.name) for p in (tmp_path / "sweep").iterdir() if p.is_dir() and p.name != "plots") == [0, 1, 2, 3]
    fault_record(f"kill -9 rank 1, --max-restarts 1, retry={retry}", _detect_s(tmp_path, 1))


def test_sigterm_to_the_group_closes_the_trial_and_the_same_command_resumes(tmp_path, fault_record):
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30", "hydra.sweeper.n_trials=3",
            "x=interval(-1,1)", "sleep_s=1"]
    env = base_env(DSO_RECORD_DIR=str(tmp_path / "records"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(REPO / APP)]
    proc = subprocess.Popen(cmd + args + ["fault.kind=hang", "fault.rank=0", "fault.trial=1", "fault.phase=after"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "records" / "trial1_rank0.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "trial 1 never started"
            time.sleep(0.2)
        time.sleep(1.5)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert _states(tmp_path) == [C, F], out[-3000:]
    assert "marked FAIL (SIGTERM)" in out
    fault_record("SIGTERM (preemption) -> running trial FAIL", time.monotonic() - t0)
    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)").check()
    assert _states(tmp_path) == [C, F, C]


def test_c09_kill9_of_rank0_the_restarted_group_closes_its_own_running_trial(tmp_path, fault_record):
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "fault.kind=kill9", "fault.rank=0",
                    "fault.trial=1", timeout_s=180, torchrun_args=["--max-restarts", "1"]).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C, F, C]
    assert "marked FAIL (its torchrun group was restarted)" in res.output
    fault_record("kill -9 rank 0 (the study's owner) -> restarted group fails its trial", _detect_s(tmp_path, 1))
