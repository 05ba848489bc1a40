"""Case C45: a failure on one rank is known to the others within seconds (issue 21).

Real torchrun worlds of 2 ranks on CPU/gloo run ``tests/apps/peer_failure_app.py``: a "training loop" of
``dist.all_reduce`` calls on the default group. In trial 1, rank 1 raises before step 5's all-reduce.

- ``fail.others=block``: rank 0 goes on with the loop and waits in ``all_reduce`` for rank 1, which never
  comes. ``rank_timeout`` is left at its default, 600 s: before C45 rank 0 sat there silently for 600 s.
  Now rank 0 logs rank 1's failure within seconds, and :data:`GRACE_S` later the group ends: trial 1 FAIL
  in the study, the resume command on its own line, every rank's own process exits 1.
  One launch, under ``--max-restarts 1``: the restarted group runs the remaining trial; trial 1 counted once.
- ``fail.others=leave`` (rank 0 stops at that step by itself within the grace: the agreed path, with the early
  log line) is a trial of the agreed-failure launch, ``tests/faults/test_faults.py``.

Times are measured from the failing rank's own clock (``failed_trial1_rank1.json``, written just before it
raises) to rank 0's log line (the job log's timestamp) and to torchrun's exit, never over the whole run.
The in-process tests (no torchrun) check the announcement and the watcher on a real ``HashStore``.
"""

import json
import logging
import re
import threading
import time
from datetime import datetime

import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import LINGER, exit_env, exit_lines, exit_statuses, load
from tests.torchrun_utils import run_torchrun

APP = "tests/apps/peer_failure_app.py"
C, F = TrialState.COMPLETE, TrialState.FAIL
#: Seconds from rank 1's failure to rank 0's log line that count as "within seconds" (polled every 0.5 s).
LEARN_WITHIN_S = 5.0
#: Seconds from rank 1's failure to the restarted group's next trial: GRACE_S, closing the trial, the
#: exit-record linger (LINGER, 5 s), torchrun's teardown and the restart (far below rank_timeout, 600 s).
ENDED_WITHIN_S = 60.0
#: rank 0's line for the learned failure (``_peer_watch.PeerWatch._read_failures``), in its job log.
LEARNED = re.compile(r"^\[(?P<at>[\d\- :,]+)\]\[[^\]]*\]\[WARNING\] - rank 1 failed trial 1: RuntimeError: injected "
                     r"failure on rank 1; rank 0 is still in the task", re.M)


def _run(tmp_path, *overrides, torchrun_args=None, timeout_s=240):
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "fail.rank=1", "fail.trial=1", *overrides]
    env = {"DSO_RECORD_DIR": str(tmp_path / "records"), **exit_env(tmp_path), **LINGER}
    res = run_torchrun(APP, args, timeout_s=timeout_s, extra_env=env, torchrun_args=torchrun_args)
    return res, time.time()


def _failed_at(tmp_path) -> float:
    return json.loads((tmp_path / "records" / "failed_trial1_rank1.json").read_text())["time"]


def _learned_after_s(tmp_path, failed_at: float, output: str) -> float:
    """Seconds from rank 1's failure to rank 0's "rank 1 failed trial 1" line in its job log."""
    log_file = tmp_path / "sweep" / "1" / "peer_failure_app_rank0.log"
    match = LEARNED.search(log_file.read_text())
    assert match, f"rank 0 never logged rank 1's failure\n{log_file.read_text()[-3000:]}\n{output[-3000:]}"
    at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return at - failed_at


@pytest.mark.torchrun
@pytest.mark.timeout(360)
def test_c45_rank0_blocked_in_all_reduce_learns_at_once_the_group_ends_and_the_restart_resumes(tmp_path, fault_record):
    """Default rank_timeout (600 s), ``--max-restarts 1``: rank 0 learns of rank 1's failure within seconds,
    closes trial 1 FAIL itself :data:`GRACE_S` later (not the training group's timeout), every rank of the first
    attempt exits 1; torchrun restarts the group, which runs the remaining trial (n_trials=3 reached:
    [C, F, C], trial 1 neither counted twice nor re-run) and exits 0.

    The same contract as rank 1 failing before a training collective with a rank_timeout below the grace (the
    training group's timeout releases rank 0 first, ``TrainingGroupBrokenError``): that release is shown by
    the skipped-call launch, ``test_skipped_calls_and_ctrl_c.py``. Rank 0 leaving the task by itself within the
    grace (the agreed path, with the early line): ``test_faults.py``'s agreed-failure launch, trial 6."""
    res, _ = _run(tmp_path, torchrun_args=["--max-restarts", "1"], timeout_s=300)
    res.check()
    failed_at = _failed_at(tmp_path)
    learned = _learned_after_s(tmp_path, failed_at, res.output)
    assert -1.0 <= learned < LEARN_WITHIN_S, f"rank 0 learned {learned:.1f} s after rank 1's failure"
    study = load(tmp_path, "peer_failure_app")
    assert [t.state for t in study.trials] == [C, F, C], res.output[-3000:]
    # rank 0 closed the trial itself (never re-queued: the task raised), once, and ended the group.
    assert re.search(r"Trial\(s\) \[1\] marked FAIL \(rank 1 failed trial 1 \(RuntimeError: injected failure on "
                     r"rank 1\) and rank 0 was still in trial 1's task", res.output), res.output[-3000:]
    assert len(re.findall(r"Trial\(s\) \[1\] marked FAIL", res.output)) == 1, res.output[-3000:]
    assert "rank 0/2 ends the torchrun group now: rank 1 failed trial 1 (RuntimeError: injected failure" in res.output
    assert re.search(r"resume the study with:\n\S", res.output), res.output[-3000:]
    assert "TrainingGroupBrokenError" not in res.output  # not released by the training group's timeout
    attempts = {p.name: json.loads(p.read_text())["attempt"] for p in (tmp_path / "records").glob("trial*_rank*.json")}
    assert attempts == {"trial0_rank0.json": 0, "trial0_rank1.json": 0, "trial1_rank0.json": 0,
                        "trial1_rank1.json": 0, "trial2_rank0.json": 1, "trial2_rank1.json": 1}, attempts
    lines = exit_lines(tmp_path)
    assert exit_statuses(tmp_path, restart=0) == {0: 1, 1: 1}, lines
    assert exit_statuses(tmp_path, restart=1) == {0: 0, 1: 0}, lines
    # The blocked group ended soon after the failure (not after rank_timeout, 600 s): trial 1 closed and the
    # restarted group's trial 2 started within ENDED_WITHIN_S of it.
    took = study.trials[2].datetime_start.timestamp() - failed_at
    assert took < ENDED_WITHIN_S, f"the restarted group started {took:.1f} s after rank 1's failure"
    fault_record(f"rank 0 blocked in all_reduce learns in {learned:.1f} s; group ends, restart completes", took,
                 measured="seconds from the failure to the restarted group's next trial")


# --- in process: the announcement and the watcher on a real store -------------------------------------


def _channels(world_size=2):
    import torch.distributed as dist

    from hydra_plugins.ds_optuna_sweeper._loop._peer_watch import PeerChannel

    store = dist.HashStore()
    return [PeerChannel(dist.PrefixStore("ds_optuna/peer_watch_0", store), r, world_size) for r in range(world_size)]


def test_c45_world_size_one_and_no_store_watch_nothing():
    from hydra_plugins.ds_optuna_sweeper._loop._peer_watch import NO_WATCH, PeerChannel
    from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm

    assert PeerChannel.open(RankComm()) is None  # world size 1
    assert PeerChannel.open(RankComm(rank=0, world_size=2)) is None  # the task's own group: no store
    with NO_WATCH as watch, watch.in_task(3):
        pass


def test_c45_a_failure_is_announced_and_a_peer_in_the_task_logs_it(caplog):
    """Rank 1's task raises while rank 0 is inside the same task: rank 0's watcher logs it within a poll,
    naming rank, trial and error; rank 0 leaving the task within the grace ends nothing."""
    from hydra_plugins.ds_optuna_sweeper._loop import _peer_watch

    ch0, ch1 = _channels()
    caplog.set_level(logging.WARNING, logger=_peer_watch.__name__)
    with ch0.watch("trial1", None) as w0, ch1.watch("trial1", None) as w1:
        with w0.in_task(1):
            with pytest.raises(ValueError), w1.in_task(1):
                raise ValueError("boom\nsecond line")
            deadline = time.monotonic() + 5
            while "rank 1 failed trial 1" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
    assert re.search(r"rank 1 failed trial 1: ValueError: boom; rank 0 is still in the task \(learned [\d.]+ s after",
                     caplog.text), caplog.text
    assert "ends the torchrun group" not in caplog.text
    assert not any(t.name == "ds-optuna-peer-watch" for t in threading.enumerate())  # joined on exit


def test_c45_pruned_and_preempted_tasks_are_not_announced(caplog):
    import optuna

    from hydra_plugins.ds_optuna_sweeper._loop import _peer_watch
    from hydra_plugins.ds_optuna_sweeper._errors import Preempted

    ch0, ch1 = _channels()
    caplog.set_level(logging.WARNING, logger=_peer_watch.__name__)
    with ch0.watch("trial2", None) as w0, ch1.watch("trial2", None) as w1:
        with w0.in_task(2):
            for exc in (optuna.TrialPruned(), Preempted(143)):
                with pytest.raises(type(exc)), w1.in_task(2):
                    raise exc
            time.sleep(3 * _peer_watch.POLL_S)
    assert not ch0.store.check(["trial2/failed/1"])
    assert "failed trial" not in caplog.text
    assert _peer_watch.GRACE_S >= 3 * _peer_watch.POLL_S  # the grace outlasts several polls
