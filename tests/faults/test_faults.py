"""Failures on one rank that every rank agrees on, ranks that stop the sweep, a hang, kill -9 under
``--max-restarts`` and swallowed signals: real torchrun worlds of 2 ranks on CPU/gloo.

Each launch plays a table of faults, one per trial (``tests/apps/fault_plan_app.py``: the plan is JSON in
``$DSO_FAULT_PLAN``), so that one contract costs one launch; ``--max-restarts`` chains the faults that end a
torchrun attempt. Each case asserts the study's trial states, the product's own lines, and each rank's own exit
status (``tests/apps/exit_record.py``: torchrun's single exit code only says that some rank failed).

What rank 0 alone decides about these runs (the failure-rate stop at world size 1, resume counting, refusals)
is tested in process: ``tests/test_sweep_edges.py``. A failure on one rank while its peer is blocked in a
collective: ``tests/faults/test_peer_failure.py``; a skipped rank-consistent call and Ctrl-C:
``tests/faults/test_skipped_calls_and_ctrl_c.py``; SIGTERM (preemption) and resume:
``tests/multirank/test_preemption.py``.

Timeouts are layered: the sweep's ``rank_timeout`` < the torchrun subprocess timeout (capped by the test's
deadline, ``tests/torchrun_utils.py``) < pytest's timeout.
"""

import json
import re

import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import LINGER, create_study, exit_env, exit_lines, exit_statuses, load, run_sweep
from tests.torchrun_utils import run_torchrun

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]

C, F = TrialState.COMPLETE, TrialState.FAIL
PLAN_APP = "tests/apps/fault_plan_app.py"
STUDY = "fault_plan_app"
BASE = ["hydra.sweeper.n_trials=3", "hydra.sweeper.max_failure_rate=1.0", "x=interval(-1,1)"]
#: For runs that assert every rank's own non-zero exit: ranks linger after writing their status, and
#: rank 0 writes no plots, so torchrun's SIGTERM to the survivors comes after every rank's own exit.
EVERY_RANK_EXITS = ["hydra.sweeper.plots=false"]
#: rank_timeout (seconds) of the test that measures it.
MEASURED_RANK_TIMEOUT_S = 8
#: The product's line when rank 0 closes trial(s) it can no longer finish (_abandon.abandon).
CLOSED = r"Trial\(s\) \[{number}\] marked FAIL \((?P<why>[^\n]*?)\)(?P<requeued>; re-queued with the same params " \
         r"\(retry_failed_trials=(?P<retry>\d+)\))?\n"


def _plan_launch(tmp_path, plan: dict, *overrides: str, sweep_dir: bool = True, timeout_s: float = 240,
                 torchrun_args=None):
    """``torchrun fault_plan_app.py -m ...`` with ``plan`` in ``$DSO_FAULT_PLAN``; records, exit lines (with
    :data:`LINGER`) under ``tmp_path``; no ``hydra.sweep.dir`` when ``sweep_dir`` is false (run from
    ``tmp_path``: Hydra's dated default)."""
    args = ["-m", *([f"hydra.sweep.dir={tmp_path / 'sweep'}"] if sweep_dir else []), *overrides]
    env = {"DSO_RECORD_DIR": str(tmp_path / "records"), "DSO_FAULT_PLAN": json.dumps(plan), **exit_env(tmp_path),
           **LINGER}
    return run_torchrun(PLAN_APP, args, timeout_s=timeout_s, extra_env=env, torchrun_args=torchrun_args,
                        cwd=tmp_path)


def _states(tmp_path, study_name="sweep_app", sweep_dir=None):
    return [t.state for t in load(tmp_path, study_name, sweep_dir).trials]


def _detect_s(trial):
    """The trial's ``datetime_complete - datetime_start`` in seconds: the "trial seconds" of the fault summary."""
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def _closed(output: str, number: int) -> list[re.Match]:
    """The product's "Trial(s) [n] marked FAIL (why)" lines for trial ``number``."""
    return list(re.finditer(CLOSED.format(number=number), output))


def _verdict(output: str, number: int, message: str) -> bool:
    """Rank 0's progress line for trial ``number``'s agreed FAIL names rank 1 and ``message``."""
    return bool(re.search(rf"Trial {number} FAIL in [\d.]+ s, params \{{[^\n]*\}} \(rank 1: {re.escape(message)}",
                          output))


# --- a failure every rank agrees on (C06, C07, C24, C45 leave, config resolved on rank 0 only) ----------------

#: Trial -> what rank 1 (or every rank) does; the rank-1 verdict rank 0 logs for it.
AGREED = {
    1: ({"kind": "raise"}, "RuntimeError: injected failure on rank 1"),  # before training: no collective after it
    2: ({"kind": "raise", "steps": 2}, "RuntimeError: injected failure on rank 1"),  # after training
    3: ({"kind": "return_nan", "steps": 2}, "the task returned NaN"),
    4: ({"kind": "text", "steps": 2}, "the task returned 'not a number' (str), not a number"),
    5: ({"kind": "none_return", "steps": 2}, "the task returned None"),
    # C45: rank 1 raises at step 5 of a training loop; rank 0 stops at that step by itself 3 s later (within the
    # grace rank 1 waits at the result gather, _exits.GRACE_S): the agreed path is kept, nobody ends the launch.
    6: ({"kind": "raise", "steps": 20, "at_step": 5, "others": "leave", "leave_after_s": 3},
        "RuntimeError: injected failure on rank 1"),
    # C24: an unguarded init_process_group on every rank.
    7: ({"kind": "init_group", "rank": "all"}, None),
}


def test_a_failure_on_one_rank_is_agreed_by_every_rank_and_the_failure_rate_stop_ends_every_rank(tmp_path,
                                                                                                    fault_record):
    """C06/C07: a failure on rank 1 only (an exception before or after training, a bad return value) is told
    FAIL by rank 0 naming rank 1 and its error, and both ranks go on to the next trial. C24: an unguarded
    ``init_process_group`` fails its trial naming the fix. A config that resolves on rank 0 only (trial 8: rank 1
    lost ``DSO_RESOLVABLE`` in trial 7) fails its trial before the task. Then the failure rate passes
    ``max_failure_rate`` (8 of 9 > 0.88, where 7 of 8 was not): every rank's own process exits 1, and the message
    says that failed trials count against n_trials and gives the exact torchrun command that resumes (C23)."""
    plan = {"trials": {str(n): step for n, (step, _) in AGREED.items()}, "unset_env_at": {"trial": 7, "rank": 1}}
    res = _plan_launch(tmp_path, plan, "hydra.sweeper.n_trials=12", "hydra.sweeper.max_failure_rate=0.88",
                       "+needs_env=${oc.env:DSO_RESOLVABLE}")
    out = res.output
    assert res.returncode != 0
    study = load(tmp_path, STUDY)
    assert [t.state for t in study.trials] == [C] + [F] * 8, out[-4000:]
    for number, (step, message) in AGREED.items():
        if message is not None:
            assert _verdict(out, number, message), (number, out[-4000:])
    # Rank 1 logs its own failure: a traceback for an exception, the reason for a bad return value.
    assert "rank 1/2, trial 1 failed:\nTraceback (most recent call last)" in out
    assert 'in inject\n    raise RuntimeError(f"injected failure on rank {rank}")' in out
    assert "rank 1/2, trial 2 failed:\nTraceback (most recent call last)" in out
    assert "rank 1, trial 3 failed: the task returned NaN" in out
    # C45, trial 6: rank 1 waited at the result gather for rank 0, which came within the grace; nobody ended the launch.
    assert "ends the launch" not in out
    # C24, trial 7.
    assert "guard the call with 'if not torch.distributed.is_initialized():'" in out
    # Trial 8: the config does not resolve on rank 1; the task never ran on any rank.
    assert "could not be resolved on rank 1" in out
    assert not list((tmp_path / "records").glob("trial8_rank*.json"))
    # The failure-rate stop, on every rank.
    assert "TrialFailedError: 8 of 9 trials of this run failed" in out and "max_failure_rate=0.88" in out
    assert "failed ones count against hydra.sweeper.n_trials=12 (raise it to run as many new ones)" in out
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    # C23: the resume command is the torchrun command, with this run's sweep dir.
    command = re.search(r"resume with: ([^\n]*)", out)[1]
    assert "--standalone --nproc_per_node 2 " in command and f"hydra.sweep.dir={tmp_path / 'sweep'}" in command, command
    fault_record("rank 1 fails 7 ways -> FAIL, sweep went on; failure rate stop -> every rank exits 1",
                 _detect_s(study.trials[1]))


# --- a rank that stops the sweep: SystemExit, KeyboardInterrupt, a destroyed default group ---------------------


@pytest.mark.soak  # the lean net's 12 min; make test keeps a failure on one rank (above)
def test_systemexit_keyboardinterrupt_and_a_destroyed_group_stop_every_rank(tmp_path, fault_record):
    """One torchrun attempt each (``--max-restarts 2``): SystemExit on rank 1 in trial 1, KeyboardInterrupt on
    rank 1 in trial 2, then (C24) the task destroys the default process group on every rank in trial 3. Each
    time the trial is closed FAIL and every rank's own process exits 1; the destroyed group is named on every
    rank at once, not reported as a timeout after rank_timeout (120 s here)."""
    plan = {"trials": {"1": {"kind": "exit", "attempt": 0}, "2": {"kind": "interrupt", "attempt": 1},
                       "3": {"kind": "destroy_group", "rank": "all", "attempt": 2}}}
    res = _plan_launch(tmp_path, plan, "hydra.sweeper.n_trials=6", "hydra.sweeper.max_failure_rate=1.0",
                       "hydra.sweeper.rank_timeout=120", torchrun_args=["--max-restarts", "2"])
    out = res.output
    assert res.returncode != 0
    trials = load(tmp_path, STUDY).trials
    assert [t.state for t in trials] == [C, F, F, F], out[-4000:]
    assert "trial 1 was interrupted" in out and "trial 2 was interrupted" in out
    lines = exit_lines(tmp_path)
    for attempt in range(3):
        assert exit_statuses(tmp_path, restart=attempt) == {0: 1, 1: 1}, (attempt, lines)
    # C24: a destroyed default group.
    assert out.count("ProcessGroupMisuseError") >= 2
    assert "the default process group was destroyed, most likely by the task" in out
    assert "RankTimeoutError" not in out
    seconds = _detect_s(trials[3])  # from trial 3's own start: start-up does not count
    assert seconds < 30, f"trial 3 closed {seconds:.1f} s after it started (rank_timeout 120 s)"
    fault_record("SystemExit, KeyboardInterrupt on rank 1, destroyed group -> FAIL, every rank stops", seconds)


def test_hang_on_rank1_ends_by_timeout_with_the_trial_closed(tmp_path, fault_record):
    """Rank 1 hangs in the task: rank 0 gives up after 2 x rank_timeout with an error naming itself,
    the trial and what it waited for, closes the trial FAIL, and exits 1; the time is measured from the
    trial's own start, not the whole run's (start-up varies with the load). (The error names the waiting rank,
    not the hung one: the gather cannot tell who is late.) The study is created before the ranks start, so
    the SQLite schema creation is not inside a wait that rank_timeout bounds."""
    rt, timeout_s = MEASURED_RANK_TIMEOUT_S, 120
    create_study(tmp_path)
    res = run_sweep(tmp_path, *BASE, f"hydra.sweeper.rank_timeout={rt}", "fault.kind=hang", "fault.rank=1",
                    "fault.trial=1", timeout_s=timeout_s)
    assert res.returncode != 0
    waited = re.search(rf"RankTimeoutError: rank 0/2 waited ([\d.]+) s \(limit {2 * rt} s\) for trial 1's trial "
                       r"result from rank\(s\) \[1\] on node 0 \([^)]*\), which never arrived", res.output)  # the hung rank, named
    assert waited, res.output[-3000:]
    assert float(waited.group(1)) >= 2 * rt
    closed = _closed(res.output, 1)
    assert len(closed) == 1 and closed[0]["why"].startswith("the sweep stopped: RankTimeoutError: rank 0/2"), \
        res.output[-3000:]
    assert _states(tmp_path) == [C, F]
    detect = _detect_s(load(tmp_path).trials[1])
    assert 2 * rt <= detect < 2 * rt + 20, f"trial 1 told FAIL {detect:.1f} s after it started (rank_timeout {rt} s)"
    statuses = exit_statuses(tmp_path)
    assert statuses.get(0) == 1, exit_lines(tmp_path)  # rank 1 is still hung when torchrun stops it
    fault_record("rank 1 hangs -> rank 0 gives up after 2 x rank_timeout, trial closed", detect)


# --- kill -9 under --max-restarts (C09, C28, C50) --------------------------------------------------------------


def test_kill9_of_rank1_then_of_rank0_under_max_restarts_resumes_in_the_first_sweep_dir(tmp_path, fault_record):
    """``--max-restarts 2``, ``retry_failed_trials=1``, no ``hydra.sweep.dir`` (Hydra's dated default, C50).
    Attempt 0: kill -9 of rank 1 inside trial 1 (before its training collectives): rank 0 closes trial 1 FAIL and
    says so, re-queued; who closes it depends on timing, and every path is the product's own line (rank 0 sees
    the peer vanish, "the sweep stopped: ...", or torchrun's SIGTERM reaches it first, "SIGTERM", or the
    restarted group does). Attempt 1 runs the retry with trial 1's params, then rank 0 (the study's owner) is
    killed in trial 3: the restarted group closes its own running trial. Attempt 2 finishes the study (both ranks
    exit 0) in the first attempt's sweep dir: one study, one job dir per trial number. C28: a trial closed because
    its worker died and re-queued is replaced by its retry in the budget."""
    plan = {"trials": {"1": {"kind": "kill9", "steps": 2, "at_step": 0, "attempt": 0},
                       "3": {"kind": "kill9", "rank": 0, "attempt": 1}}}
    res = _plan_launch(tmp_path, plan, "hydra.sweeper.n_trials=4", "hydra.sweeper.rank_timeout=30",
                       "hydra.sweeper.retry_failed_trials=1", sweep_dir=False, timeout_s=270,
                       torchrun_args=["--max-restarts", "2"])
    res.check()
    out = res.output
    dbs = sorted(tmp_path.glob("multirun/*/*/optuna.db"))
    assert len(dbs) == 1, (dbs, out[-4000:])
    sweep = dbs[0].parent
    assert [p for p in tmp_path.glob("multirun/*/*") if p.is_dir()] == [sweep]
    assert "resuming in the first attempt's sweep dir" in out
    assert "torchrun restarts the group now (restart 1 of 2, --max-restarts)" in out, out[-4000:]
    study = load(tmp_path, STUDY, sweep)
    assert [t.state for t in study.trials] == [C, F, C, F, C, C], out[-4000:]
    first, second = _closed(out, 1), _closed(out, 3)
    assert len(first) == 1 and len(second) == 1, out[-4000:]
    assert re.match(r"the sweep stopped: |SIGTERM$|its torchrun group was restarted$", first[0]["why"]), first[0][0]
    assert second[0]["why"] == "its torchrun group was restarted", second[0][0]
    for closed, retry in ((first[0], 2), (second[0], 4)):
        assert closed["retry"] == "1", closed[0]
        failed = retry - 1
        assert study.trials[retry].params == study.trials[failed].params
        assert study.trials[retry].system_attrs.get("failed_trial") == failed
    # Job dirs are never reused: one per trial number.
    assert sorted(int(p.name) for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()) == \
        list(range(len(study.trials)))
    lines = exit_lines(tmp_path)
    assert exit_statuses(tmp_path, restart=0).get(1) == -9, lines  # rank 1's process died of the SIGKILL
    assert exit_statuses(tmp_path, restart=1).get(0) == -9, lines
    assert exit_statuses(tmp_path, restart=2) == {0: 0, 1: 0}, lines
    fault_record("kill -9 of rank 1, then of rank 0, --max-restarts 2 -> closed, retried, study complete",
                 _detect_s(study.trials[1]))


# --- a signal whose exception Python swallows ------------------------------------------------------------------


@pytest.mark.parametrize("nproc,signal_name", [
    (1, "TERM"),
    pytest.param(2, "INT", marks=pytest.mark.soak),  # the lean net's 12 min; make test keeps SIGTERM's
])
def test_a_signal_whose_exception_is_swallowed_still_stops_the_sweep(tmp_path, fault_record, nproc, signal_name):
    """Ctrl-C (or SIGTERM) whose exception Python drops ("Exception ignored in ..."): it landed in a
    ``__del__`` on rank 0 during trial 1, the task went on and returned. Found by a new-user trial at
    world size 1 (2 Ctrl-C in 10 landed in SQLAlchemy's ``_collection_gced`` and the sweep ran to its
    end, exit 0). The sweep must still stop before it asks trial 2: trial 1 is kept as it ended, every
    rank exits with the interruption's status (C41: 130 for SIGINT on every rank, the others learn it from
    rank 0's record in torchrun's store; SIGTERM: 143), and the log names the signal and the resume command."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=5", "x=interval(-1,1)", "fault.kind=signal_in_del",
                    "fault.rank=0", "fault.trial=1", *EVERY_RANK_EXITS, nproc=nproc,
                    env={**LINGER, "DSO_TEST_SIGNAL": signal_name})
    assert "Exception ignored in" in res.output  # the injected signal really was swallowed
    assert _states(tmp_path) == [C, C], res.output[-3000:]
    name = "SIGINT (Ctrl-C)" if signal_name == "INT" else "SIGTERM"
    assert f"rank 0 received {name} during the last trial; every rank stops before the next one" in res.output
    assert re.search(r"Resume the study with:\n\S", res.output), "the resume command is not on a line of its own"
    expected = 143 if signal_name == "TERM" else 130
    assert exit_statuses(tmp_path) == {r: expected for r in range(nproc)}, exit_lines(tmp_path)
    fault_record(f"SIG{signal_name} swallowed in __del__, {nproc} rank(s) -> stops before the next trial",
                 _detect_s(load(tmp_path).trials[1]))
