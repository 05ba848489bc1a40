"""Failures on one rank at every phase, crashes, restarts and preemption, under real torchrun.

Each case asserts the study's trial states afterwards, the product's own log line for who closed a
trial, and each rank's own exit status (``tests/apps/exit_record.py`` records one line per rank process;
torchrun's single exit code only says that some rank failed).

Timeouts are layered: the sweep's ``rank_timeout`` < the torchrun subprocess timeout (capped by the
test's deadline, ``tests/torchrun_utils.py``) < pytest's timeout. ``rank_timeout`` is 30 s (the
``run_sweep`` default) or 15 s, except in the two tests that measure it (:data:`MEASURED_RANK_TIMEOUT_S`);
those create the study before the ranks start, so the slow part of set-up (SQLite schema creation on
a loaded machine, while the other rank waits under ``rank_timeout``) is done before any wait that
``rank_timeout`` bounds; what is left (rendezvous, loading the study) took under 1 s in runs here.
"""

import re
import subprocess
import time

import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import APP, LINGER, create_study, exit_lines, exit_statuses, load, records, run_sweep
from tests.torchrun_utils import base_env, kill_tree, start_process, time_left, torchrun_command, wait_process

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]

C, F = TrialState.COMPLETE, TrialState.FAIL
BASE = ["hydra.sweeper.n_trials=3", "hydra.sweeper.max_failure_rate=1.0", "x=interval(-1,1)"]
#: For runs that assert every rank's own non-zero exit: ranks linger after writing their status, and
#: rank 0 writes no plots, so torchrun's SIGTERM to the survivors comes after every rank's own exit.
EVERY_RANK_EXITS = ["hydra.sweeper.plots=false"]
#: rank_timeout (seconds) of the tests that measure it; the rest use 15 s or more.
MEASURED_RANK_TIMEOUT_S = 8
#: The product's line when rank 0 closes trial(s) it can no longer finish (_abandon.abandon).
CLOSED = r"Trial\(s\) \[{number}\] marked FAIL \((?P<why>[^\n]*?)\)(?P<requeued>; re-queued with the same params " \
         r"\(retry_failed_trials=(?P<retry>\d+)\))?\n"


def _states(tmp_path):
    return [t.state for t in load(tmp_path).trials]


def _detect_s(tmp_path, number):
    """Trial ``number``'s ``datetime_complete - datetime_start`` in seconds (None while unfinished): the
    "trial seconds" of the fault summary, the time to detect only for a fault at the trial's start."""
    t = load(tmp_path).trials[number]
    return (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete else None


def _closed(output: str, number: int) -> list[re.Match]:
    """The product's "Trial(s) [n] marked FAIL (why)" lines for trial ``number``."""
    return list(re.finditer(CLOSED.format(number=number), output))


def _rank_exits(tmp_path, restart=0):
    """Each rank's own exit status of torchrun attempt ``restart``, with the lines for the message."""
    return exit_statuses(tmp_path, restart), exit_lines(tmp_path)


@pytest.mark.parametrize(
    "kind, phase, message",
    [
        ("raise", "before", "RuntimeError: injected failure on rank 1"),
        ("raise", "after", "RuntimeError: injected failure on rank 1"),
        ("return_nan", "after", "the task returned NaN"),
        ("text", "after", "the task returned 'not a number' (str), not a number"),
        ("none_return", "after", "the task returned None"),
    ],
)
def test_c06_c07_failure_on_rank1_is_agreed_and_the_sweep_goes_on(tmp_path, fault_record, kind, phase, message):
    """A failure on rank 1 only is told FAIL by rank 0 naming rank 1 and its error; both ranks go on to
    trial 2 and exit 0."""
    # "before" with no collective after it: the other rank is not left waiting in the training group.
    collectives = 2 if phase == "after" else 0
    res = run_sweep(tmp_path, *BASE, f"fault.kind={kind}", f"fault.phase={phase}", "fault.rank=1",
                    "fault.trial=1", f"collectives={collectives}").check()
    assert _states(tmp_path) == [C, F, C]
    # Rank 1 logs its own failure: a traceback for an exception, the reason for a bad return value.
    if kind == "raise":
        assert "rank 1/2, trial 1 failed:\nTraceback (most recent call last)" in res.output
    else:
        assert f"rank 1, trial 1 failed: {message}" in res.output
    # Rank 0's progress line for the agreed verdict names the failed rank and its error.
    assert re.search(rf"Trial 1 FAIL in [\d.]+ s, params \{{[^\n]*\}} \(rank 1: {re.escape(message)}", res.output), \
        res.output[-3000:]
    statuses, lines = _rank_exits(tmp_path)
    assert statuses == {0: 0, 1: 0}, lines
    fault_record(f"{kind} {phase} training on rank 1 -> FAIL, sweep went on", _detect_s(tmp_path, 1))


def test_c07_traceback_is_logged_with_rank_and_trial(tmp_path, fault_record):
    res = run_sweep(tmp_path, *BASE, "fault.kind=raise", "fault.rank=1", "fault.trial=0").check()
    assert "rank 1/2, trial 0 failed:\nTraceback (most recent call last)" in res.output
    assert 'in _inject\n    raise RuntimeError(f"injected failure on rank {RANK}")' in res.output
    fault_record("traceback logged", _detect_s(tmp_path, 0))


def test_c07_max_failure_rate_zero_exits_non_zero_on_every_rank(tmp_path, fault_record):
    """max_failure_rate=0: the first failure stops the sweep, and every rank's own process exits 1."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "fault.kind=raise",
                    "fault.rank=1", "fault.trial=0", *EVERY_RANK_EXITS, env=LINGER)
    assert res.returncode != 0
    assert _states(tmp_path) == [F]
    assert "TrialFailedError: 1 of 1 trials of this run failed" in res.output
    # The resume line repeats the command: the message says the failed trial used up budget (a new user
    # resumed with the same n_trials and nothing ran).
    assert "failed ones count against hydra.sweeper.n_trials=3 (raise it to run as many new ones)" in res.output
    statuses, lines = _rank_exits(tmp_path)
    assert statuses == {0: 1, 1: 1}, lines
    fault_record("max_failure_rate=0 -> every rank non-zero", _detect_s(tmp_path, 0))


def test_config_that_resolves_on_rank0_only_fails_the_trial(tmp_path, fault_record):
    res = run_sweep(tmp_path, *BASE, "+needs_env=${oc.env:DSO_RANK0_ONLY}").check()
    assert _states(tmp_path) == [F, F, F]
    assert "could not be resolved on rank 1" in res.output
    assert records(tmp_path) == {}
    fault_record("config resolution fails on rank 1 -> FAIL before the task", _detect_s(tmp_path, 0))


def test_rank1_failing_before_a_training_collective_releases_rank0_and_exits_for_restart(tmp_path, fault_record):
    """Rank 0 waits in a training all_reduce that rank 1 never joins, with a rank_timeout (8 s) below the
    peer watch's grace (``_peer_watch.GRACE_S``, 10 s, case C45): the training group's timeout releases it
    first, trial 1 is told FAIL after [rank_timeout, 2 x rank_timeout) (before rank 1's own 2 x rank_timeout
    wait for the result would expire), and every rank exits 1. With a longer rank_timeout (the default,
    600 s) the group ends after the grace instead: ``test_peer_failure.py``."""
    rt = MEASURED_RANK_TIMEOUT_S
    create_study(tmp_path)
    res = run_sweep(tmp_path, *BASE, f"hydra.sweeper.rank_timeout={rt}", "fault.kind=raise", "fault.phase=before",
                    "fault.rank=1", "fault.trial=1", "collectives=3", *EVERY_RANK_EXITS, timeout_s=120, env=LINGER)
    assert res.returncode != 0
    # Rank 0's own failure is the training group's timeout; rank 1's is the injected error.
    assert re.search(r"TrainingGroupBrokenError: trial 1 failed \(rank 0: RuntimeError: [^\n]*Timed out[^\n]*; "
                     r"rank 1: RuntimeError: injected failure on rank 1\) and left the training process group broken",
                     res.output), res.output[-3000:]
    assert _states(tmp_path) == [C, F], res.output[-3000:]
    detect = _detect_s(tmp_path, 1)
    # Which wait released rank 0 is pinned by the error above (the training group's timeout, not rank 1's
    # 2 x rank_timeout wait for the result, which would be a RankTimeoutError). The trial's seconds also hold
    # Hydra's compose before the collective and the job's teardown after it, seconds on a loaded machine:
    # hence + 10 s on the upper bound, which is not the mechanism's.
    assert rt <= detect < 2 * rt + 10, f"trial 1 told FAIL {detect:.1f} s after it started (rank_timeout {rt} s)"
    statuses, lines = _rank_exits(tmp_path)
    assert statuses == {0: 1, 1: 1}, lines
    fault_record("rank 0 stuck in a collective released after rank_timeout; group exits", detect)


def test_rank1_failing_before_a_collective_under_max_restarts_resumes(tmp_path, fault_record):
    """Same failure under ``--max-restarts 1`` with rank_timeout 15 s (above the peer watch's grace, so the
    group is ended by rank 0's watcher, case C45): both ranks of the first attempt exit 1, torchrun restarts
    the group, which finishes the study (both ranks exit 0)."""
    res = run_sweep(tmp_path, *BASE, "hydra.sweeper.rank_timeout=15", "fault.kind=raise", "fault.phase=before",
                    "fault.rank=1", "fault.trial=1", "collectives=3", *EVERY_RANK_EXITS, timeout_s=180,
                    torchrun_args=["--max-restarts", "1"], env=LINGER).check()
    assert _states(tmp_path) == [C, F, C]
    assert "rank 0/2 ends the torchrun group now: rank 1 failed trial 1 (RuntimeError: injected failure" in res.output
    first, lines = _rank_exits(tmp_path, restart=0)
    assert first == {0: 1, 1: 1}, lines
    assert exit_statuses(tmp_path, restart=1) == {0: 0, 1: 0}, lines
    fault_record("same under --max-restarts 1 -> restarted, study complete", _detect_s(tmp_path, 1))


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
def test_systemexit_and_keyboardinterrupt_on_rank1_stop_every_rank(tmp_path, fault_record, kind):
    res = run_sweep(tmp_path, *BASE, f"fault.kind={kind}", "fault.rank=1", "fault.trial=1", *EVERY_RANK_EXITS,
                    env=LINGER)
    assert res.returncode != 0
    assert _states(tmp_path) == [C, F]
    assert "trial 1 was interrupted" in res.output
    statuses, lines = _rank_exits(tmp_path)
    assert statuses == {0: 1, 1: 1}, lines
    fault_record(f"{kind} on rank 1 -> FAIL, all ranks stop", _detect_s(tmp_path, 1))


@pytest.mark.parametrize("nproc,signal_name", [(1, "INT"), (1, "TERM"), (2, "INT")])
def test_a_signal_whose_exception_is_swallowed_still_stops_the_sweep(tmp_path, fault_record, nproc, signal_name):
    """Ctrl-C (or SIGTERM) whose exception Python drops ("Exception ignored in ..."): it landed in a
    ``__del__`` on rank 0 during trial 1, the task went on and returned. Found by a new-user trial at
    world size 1 (2 Ctrl-C in 10 landed in SQLAlchemy's ``_collection_gced`` and the sweep ran to its
    end, exit 0). The sweep must still stop before it asks trial 2: trial 1 is kept as it ended, every
    rank exits with the interruption's status (C41: 130 for SIGINT on every rank, the others learn it from
    rank 0's record in torchrun's store; SIGTERM: 143), and the log names the signal and the resume command."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=5", "x=interval(-1,1)", "fault.kind=signal_in_del", "fault.rank=0",
                    "fault.trial=1", *EVERY_RANK_EXITS, nproc=nproc, env={**LINGER, "DSO_TEST_SIGNAL": signal_name})
    assert "Exception ignored in" in res.output  # the injected signal really was swallowed
    assert _states(tmp_path) == [C, C], res.output[-3000:]
    name = "SIGINT (Ctrl-C)" if signal_name == "INT" else "SIGTERM"
    assert f"rank 0 received {name} during the last trial; every rank stops before the next one" in res.output
    assert re.search(r"Resume the study with:\n\S", res.output), "the resume command is not on a line of its own"
    expected = 143 if signal_name == "TERM" else 130
    statuses, lines = _rank_exits(tmp_path)
    assert statuses == {r: expected for r in range(nproc)}, lines
    fault_record(f"SIG{signal_name} swallowed in __del__, {nproc} rank(s) -> stops before the next trial",
                 _detect_s(tmp_path, 1))


def test_hang_on_rank1_ends_by_timeout_with_the_trial_closed(tmp_path, fault_record):
    """Rank 1 hangs in the task: rank 0 gives up after 2 x rank_timeout with an error naming itself,
    the trial and what it waited for, closes the trial FAIL, and exits 1; the time is measured from the
    trial's own start, not the whole run's (start-up varies with the load). (The error names the waiting rank, not the hung one: the gather cannot tell who is late.)"""
    rt, timeout_s = MEASURED_RANK_TIMEOUT_S, 120
    create_study(tmp_path)
    res = run_sweep(tmp_path, *BASE, f"hydra.sweeper.rank_timeout={rt}", "fault.kind=hang", "fault.rank=1",
                    "fault.trial=1", timeout_s=timeout_s)
    assert res.returncode != 0
    waited = re.search(rf"RankTimeoutError: rank 0/2 waited ([\d.]+) s \(limit {2 * rt} s\) for trial 1's trial "
                       r"result from rank\(s\) \[1\], which never arrived", res.output)  # the hung rank, named
    assert waited, res.output[-3000:]
    assert float(waited.group(1)) >= 2 * rt
    closed = _closed(res.output, 1)
    assert len(closed) == 1 and closed[0]["why"].startswith("the sweep stopped: RankTimeoutError: rank 0/2"), \
        res.output[-3000:]
    assert _states(tmp_path) == [C, F]
    detect = _detect_s(tmp_path, 1)
    assert 2 * rt <= detect < 2 * rt + 20, f"trial 1 told FAIL {detect:.1f} s after it started (rank_timeout {rt} s)"
    statuses, lines = _rank_exits(tmp_path)
    assert statuses.get(0) == 1, lines  # rank 1 is still hung when torchrun stops it (a signal, not its own exit)
    fault_record("rank 1 hangs -> rank 0 gives up after 2 x rank_timeout, trial closed", detect)


@pytest.mark.parametrize("retry", [0, 1])
def test_c09_kill9_of_rank1_mid_trial_restarts_and_resumes(tmp_path, fault_record, retry):
    """kill -9 of rank 1 inside trial 1: rank 0 closes trial 1 FAIL and says so (re-queued with
    retry_failed_trials=1), torchrun restarts the group, whose ranks finish the study and exit 0.

    Who closes the trial depends on timing, and every path is the product's own line: rank 0 sees the
    peer vanish ("the sweep stopped: ..."), or torchrun's SIGTERM reaches it first ("SIGTERM"), or it
    died before closing and the restarted group does ("its torchrun group was restarted")."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "fault.kind=kill9", "fault.rank=1",
                    "fault.trial=1", "collectives=2", "fault.phase=before", f"hydra.sweeper.retry_failed_trials={retry}",
                    timeout_s=180, torchrun_args=["--max-restarts", "1"]).check()
    study = load(tmp_path)
    # C28: a trial closed because its worker died and re-queued is replaced by its retry in the budget.
    assert [t.state for t in study.trials] == ([C, F, C, C, C] if retry else [C, F, C, C])
    closed = _closed(res.output, 1)
    assert len(closed) == 1, res.output[-4000:]
    assert re.match(r"the sweep stopped: |SIGTERM$|its torchrun group was restarted$", closed[0]["why"]), closed[0][0]
    if retry:
        assert closed[0]["retry"] == "1", closed[0][0]
        assert study.trials[2].params == study.trials[1].params
        assert study.trials[2].system_attrs.get("failed_trial") == 1
    else:
        assert closed[0]["requeued"] is None, closed[0][0]
        assert study.trials[2].params != study.trials[1].params
    # Job dirs are never reused: one per trial number.
    assert sorted(int(p.name) for p in (tmp_path / "sweep").iterdir() if p.is_dir() and p.name != "plots") == \
        list(range(len(study.trials)))
    lines = exit_lines(tmp_path)
    assert exit_statuses(tmp_path, restart=1) == {0: 0, 1: 0}, lines
    assert exit_statuses(tmp_path, restart=0).get(1) == -9, lines  # rank 1's process died of the SIGKILL
    fault_record(f"kill -9 rank 1, --max-restarts 1, retry={retry}", _detect_s(tmp_path, 1))


@pytest.mark.parametrize("retry", [0, 1])
def test_sigterm_to_the_group_closes_the_trial_and_the_same_command_resumes(tmp_path, fault_record, retry):
    """SIGTERM to torchrun while rank 0 is inside trial 1 (preemption): rank 0 closes trial 1 FAIL
    (re-queued with retry_failed_trials=1) and its process exits 143; the same command resumes the
    study, and with the retry runs the re-queued trial with trial 1's params."""
    sweep_args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30",
                  "hydra.sweeper.n_trials=3", "x=interval(-1,1)", f"hydra.sweeper.retry_failed_trials={retry}"]
    env = base_env(DSO_RECORD_DIR=str(tmp_path / "records"), DSO_EXIT_DIR=str(tmp_path / "exits"))
    cmd = torchrun_command(APP, sweep_args + ["sleep_s=1", "fault.kind=hang", "fault.rank=0", "fault.trial=1",
                                              "fault.phase=after"])
    log = tmp_path / "preempted.log"
    with open(log, "w") as out:
        proc = start_process(cmd, cwd=tmp_path, env=env, stdout=out)
    try:
        left = time_left()  # keep 60 s of the test's budget for the SIGTERM and the resumed run
        deadline = time.monotonic() + (90 if left is None else min(90, left - 60))
        while not (tmp_path / "records" / "trial1_rank0.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, f"trial 1 never started\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        time.sleep(1.5)  # rank 0 is in the task (sleep_s=1, then the hang)
        t0 = time.monotonic()
        proc.terminate()  # SIGTERM to torchrun, which passes it on to its ranks (as on preemption)
        try:
            wait_process(proc, timeout_s=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 60 s after SIGTERM\n{log.read_text()[-3000:]}") from None
        detect = time.monotonic() - t0
    finally:
        kill_tree(proc)
    output = log.read_text()
    # With the retry, the copy of trial 1 waits in the study for the next run.
    assert _states(tmp_path) == ([C, F, TrialState.WAITING] if retry else [C, F]), output[-3000:]
    assert "rank 0 received SIGTERM: closing the running trial and exiting" in output
    closed = _closed(output, 1)
    assert len(closed) == 1 and closed[0]["why"] == "SIGTERM", output[-3000:]
    assert closed[0]["retry"] == ("1" if retry else None), closed[0][0]
    lines = exit_lines(tmp_path)
    assert exit_statuses(tmp_path).get(0) == 143, lines  # Preempted: SystemExit(128 + SIGTERM) on rank 0
    fault_record(f"SIGTERM (preemption), retry={retry} -> running trial FAIL, rank 0 exits 143", detect,
                 measured="seconds from SIGTERM to torchrun's exit")

    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)").check()
    study = load(tmp_path)
    # C28: the preempted trial and its retry count once: 3 trials that ran to an end, plus the closed one.
    assert [t.state for t in study.trials] == ([C, F, C, C] if retry else [C, F, C])
    if retry:  # trial 1 (closed, then re-queued as trial 2) does not count; trial 2 counts once it runs
        assert "budget n_trials=3 (1 already counted)" in res.output, res.output[-3000:]
    recs = records(tmp_path)
    if retry:
        assert study.trials[2].params == study.trials[1].params
        assert study.trials[2].system_attrs.get("failed_trial") == 1
        assert [recs[(2, r)]["config"]["x"] for r in range(2)] == [study.trials[1].params["x"]] * 2
    else:
        assert study.trials[2].params != study.trials[1].params


def test_c09_kill9_of_rank0_the_restarted_group_closes_its_own_running_trial(tmp_path, fault_record):
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "fault.kind=kill9", "fault.rank=0",
                    "fault.trial=1", timeout_s=180, torchrun_args=["--max-restarts", "1"]).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C, F, C]
    closed = _closed(res.output, 1)
    assert [m["why"] for m in closed] == ["its torchrun group was restarted"], res.output[-4000:]
    lines = exit_lines(tmp_path)
    assert exit_statuses(tmp_path, restart=1) == {0: 0, 1: 0}, lines
    fault_record("kill -9 rank 0 (the study's owner) -> restarted group fails its trial", _detect_s(tmp_path, 1))
