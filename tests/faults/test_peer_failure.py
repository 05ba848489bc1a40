"""Case C45: a failure on one rank while its peers wait in a training collective ends the launch within seconds
(issue 21; issue 40's one exit policy: torchrun owns process failure).

Real torchrun worlds of 2 ranks on CPU/gloo run ``tests/apps/peer_failure_app.py``: a "training loop" of
``dist.all_reduce`` calls on the default group. In trial 1, rank 1 raises before step 5's all-reduce.

- ``fail.others=block``: rank 0 goes on with the loop and waits in ``all_reduce`` for rank 1, which never
  comes. ``rank_timeout`` is left at its default, 600 s: before C45 rank 0 sat there silently for 600 s.
  Now rank 1 waits :data:`GRACE_S` at the result gather for rank 0's arrival, then records its failure in
  torchrun's store and exits 1; gloo's all-reduce on rank 0 breaks at once, rank 0 closes trial 1 FAIL from the
  record (never re-queued: the task raised), prints the resume command on its own line and exits 1 too.
  One launch, under ``--max-restarts 1``: the restarted group runs the remaining trial; trial 1 counted once.
- ``fail.others=leave`` (rank 0 stops at that step by itself within the grace: the agreed path) is a trial of
  the agreed-failure launch, ``tests/faults/test_faults.py``.

Times are measured from the failing rank's own clock (``failed_trial1_rank1.json``, written just before it
raises) to the restarted group's next trial, never over the whole run. The in-process tests (no torchrun)
check the arrival wait and the failure record on a real ``HashStore``.
"""

import json
import re
import threading
import time

import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import LINGER, exit_env, exit_lines, exit_statuses, load
from tests.torchrun_utils import run_torchrun

APP = "tests/apps/peer_failure_app.py"
C, F = TrialState.COMPLETE, TrialState.FAIL
#: Seconds from rank 1's failure to the restarted group's next trial: GRACE_S, closing the trial, the
#: exit-record linger (LINGER, 5 s), torchrun's teardown and the restart (far below rank_timeout, 600 s).
ENDED_WITHIN_S = 60.0


def _run(tmp_path, *overrides, torchrun_args=None, timeout_s=240):
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "fail.rank=1", "fail.trial=1", *overrides]
    env = {"DSO_RECORD_DIR": str(tmp_path / "records"), **exit_env(tmp_path), **LINGER}
    res = run_torchrun(APP, args, timeout_s=timeout_s, extra_env=env, torchrun_args=torchrun_args)
    return res, time.time()


def _failed_at(tmp_path) -> float:
    return json.loads((tmp_path / "records" / "failed_trial1_rank1.json").read_text())["time"]


@pytest.mark.torchrun
@pytest.mark.timeout(360)
def test_c45_rank0_blocked_in_all_reduce_the_failing_rank_ends_the_launch_and_the_restart_resumes(tmp_path,
                                                                                                   fault_record):
    """Default rank_timeout (600 s), ``--max-restarts 1``: rank 1 ends the launch :data:`GRACE_S` after its
    failure (not the training group's timeout), rank 0 closes trial 1 FAIL once from rank 1's record, both ranks
    of the first attempt exit 1; torchrun restarts the group, which runs the remaining trial (n_trials=3 reached:
    [C, F, C], trial 1 neither counted twice nor re-run) and exits 0.

    Rank 0 leaving the task by itself within the grace (the agreed path): ``test_faults.py``'s agreed-failure
    launch, trial 6."""
    from hydra_plugins.ds_optuna_sweeper._loop._exits import GRACE_S

    res, _ = _run(tmp_path, torchrun_args=["--max-restarts", "1"], timeout_s=300)
    res.check()
    failed_at = _failed_at(tmp_path)
    study = load(tmp_path, "peer_failure_app")
    assert [t.state for t in study.trials] == [C, F, C], res.output[-3000:]
    # rank 1 said why it ends the launch; rank 0 closed the trial from its record (never re-queued: the task
    # raised), once.
    assert re.search(r"rank 1/2 ends the launch: it failed trial 1 \(RuntimeError: injected failure on rank 1\) and "
                     rf"rank\(s\) \[0\] on node 0 \([^)]*\) did not reach the trial result's gather within {GRACE_S:g} s", res.output), \
        res.output[-3000:]
    assert re.search(r"Trial\(s\) \[1\] marked FAIL \(rank 1 failed trial 1 \(RuntimeError: injected failure on "
                     r"rank 1\) and ended the launch", res.output), res.output[-3000:]
    assert len(re.findall(r"Trial\(s\) \[1\] marked FAIL", res.output)) == 1, res.output[-3000:]
    assert re.search(r"resume the study with:\n\S", res.output), res.output[-3000:]
    assert "TrainingGroupBrokenError" not in res.output  # not released by the training group's timeout
    attempts = {p.name: json.loads(p.read_text())["attempt"] for p in (tmp_path / "records").glob("trial*_rank*.json")}
    assert attempts == {"trial0_rank0.json": 0, "trial0_rank1.json": 0, "trial1_rank0.json": 0,
                        "trial1_rank1.json": 0, "trial2_rank0.json": 1, "trial2_rank1.json": 1}, attempts
    lines = exit_lines(tmp_path)
    assert exit_statuses(tmp_path, restart=0) == {0: 1, 1: 1}, lines
    assert exit_statuses(tmp_path, restart=1) == {0: 0, 1: 0}, lines
    # The blocked launch ended soon after the failure (not after rank_timeout, 600 s): trial 1 closed and the
    # restarted group's trial 2 started within ENDED_WITHIN_S of it.
    took = study.trials[2].datetime_start.timestamp() - failed_at
    assert GRACE_S <= took < ENDED_WITHIN_S, f"the restarted group started {took:.1f} s after rank 1's failure"
    fault_record("rank 0 blocked in all_reduce; rank 1 ends the launch, the restart completes", took,
                 measured="seconds from the failure to the restarted group's next trial")


@pytest.mark.soak  # the lean net's 12 min; make test keeps the C45 launch (above)
@pytest.mark.torchrun
@pytest.mark.timeout(240)
def test_c45_with_trial_groups_a_failing_rank_ends_the_launch_and_no_trial_is_left_running(tmp_path):
    """4 ranks, ``n_jobs=2``: launch rank 3 (trial group 1's second rank) fails its first trial while its group's
    first rank waits in all_reduce, and ends the launch. Global rank 0, waiting at the end for group 1 (its own
    group ran the rest of the budget) or in its own trial, gets torchrun's SIGTERM: the failed trial is closed
    FAIL, none is left RUNNING, and the results are written (found by a trial of issue 40's exit policy: rank 0,
    killed by the SIGTERM while it waited, left the trial RUNNING)."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "fail.rank=3", "fail.trial=first",
            "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=6"]
    res = run_torchrun(APP, args, nproc=4, timeout_s=200, extra_env={"DSO_RECORD_DIR": str(tmp_path / "records")})
    assert res.returncode != 0, res.output[-3000:]
    (failed,) = (tmp_path / "records").glob("failed_trial*_rank3.json")
    number = int(failed.name.removeprefix("failed_trial").split("_")[0])
    assert re.search(rf"rank 1/2 of trial group 1/2 ends the launch: it failed trial {number} \(RuntimeError: injected "
                     r"failure on rank 3\)", res.output), res.output[-3000:]
    study = load(tmp_path, "peer_failure_app")
    states = {t.number: t.state for t in study.trials}
    assert states[number] == F and TrialState.RUNNING not in states.values(), (states, res.output[-3000:])
    assert (tmp_path / "sweep" / "optimization_results.yaml").exists(), res.output[-3000:]


# --- in process: the arrival wait and the failure record on a real store -------------------------------


def _store():
    import torch.distributed as dist

    return dist.PrefixStore("ds_optuna/control_0", dist.HashStore())


def test_c45_the_arrival_wait_returns_at_once_when_every_rank_is_there():
    from hydra_plugins.ds_optuna_sweeper._comm import _wire
    from hydra_plugins.ds_optuna_sweeper._comm._ranks import absent_after

    store, key = _store(), _wire.arrival_key("trial result", 3)
    for rank in (0, 1):
        store.set(_wire.arrival_mark(key, rank), "1")
    start = time.monotonic()
    assert absent_after(store, key, 2, 30.0) == []
    assert time.monotonic() - start < 1.0


def test_c45_the_arrival_wait_names_the_absent_rank_after_the_grace():
    from hydra_plugins.ds_optuna_sweeper._comm import _wire
    from hydra_plugins.ds_optuna_sweeper._comm._ranks import absent_after

    store, key = _store(), _wire.arrival_key("trial result", 3)
    store.set(_wire.arrival_mark(key, 1), "1")
    start = time.monotonic()
    assert absent_after(store, key, 3, 0.5) == [0, 2]
    assert 0.5 <= time.monotonic() - start < 2.0


def test_c45_a_peer_arriving_within_the_grace_is_no_absence():
    """A peer that fails the same way a moment later (the agreed path) arrives within the grace: nobody ends the
    launch."""
    from hydra_plugins.ds_optuna_sweeper._comm import _wire
    from hydra_plugins.ds_optuna_sweeper._comm._ranks import absent_after

    store, key = _store(), _wire.arrival_key("trial result", 4)
    store.set(_wire.arrival_mark(key, 1), "1")
    later = threading.Timer(0.4, store.set, (_wire.arrival_mark(key, 0), "1"))
    later.start()
    start = time.monotonic()
    assert absent_after(store, key, 2, 10.0) == []
    assert time.monotonic() - start < 3.0
    later.join()


def test_c45_only_failed_and_interrupted_tasks_wait_and_a_signal_sets_the_status():
    import signal

    from hydra_plugins.ds_optuna_sweeper._comm._launch_end import LaunchEnd
    from hydra_plugins.ds_optuna_sweeper._loop._agree import Outcome, RankOutcome
    from hydra_plugins.ds_optuna_sweeper._loop._exits import GRACE_S, INTERRUPT_GRACE_S, failure_of, grace_s

    agreed = [RankOutcome(1, Outcome.OK, values=(1.0,)), RankOutcome(2, Outcome.PRUNED),
              RankOutcome(3, Outcome.PREEMPTED)]
    assert failure_of(1, agreed, None) is None  # pruned and preempted end on every rank together
    failed = failure_of(1, agreed + [RankOutcome(4, Outcome.FAILED, error="ValueError: boom")], None)
    assert failed == LaunchEnd(1, 1, "ValueError: boom", 4, ended=True)
    assert grace_s(failed) == GRACE_S and failed.what == "failed trial 4 (ValueError: boom)"
    ctrl_c = failure_of(1, [RankOutcome(5, Outcome.INTERRUPTED, error="KeyboardInterrupt")], signal.SIGINT)
    assert ctrl_c.status == 130 and grace_s(ctrl_c) == INTERRUPT_GRACE_S
    assert ctrl_c.what == "was interrupted by SIGINT (Ctrl-C) in trial 5"
    # SystemExit raised by the task itself (no signal): a failure like any other, status 1
    assert failure_of(0, [RankOutcome(6, Outcome.INTERRUPTED, error="SystemExit: 2")], None).status == 1
