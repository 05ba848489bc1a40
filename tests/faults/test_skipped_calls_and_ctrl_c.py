"""C34: a rank skips a rank-consistent call (report, should_prune, suggest_*); C41: Ctrl-C looks like a crash.

Real torchrun worlds of 2 ranks on CPU. C34 (one launch of ``tests/apps/fault_plan_app.py``): a trial makes one
of its calls on rank 0 only (a metric logged on rank 0 only, optuna/optuna#1417); the trial must fail within
``rank_timeout`` with a message naming rank 1 and the call, never saying a rank died, and the sweep goes on. The
call check itself (positions, end records, the wait notes) is tested in process:
``tests/test_call_check_and_launch_end.py``. C41 runs ``tests/apps/skip_call_app.py``.
C41: SIGINT to torchrun's whole process group (as Ctrl-C in a terminal) while trial 1 runs; torchrun passes it to
every rank. Every rank's own exit status must be 130 (``tests/apps/exit_record.py``), trial 1 closed FAIL, the
resume command on a line of its own, and no "lost a peer"/"died".

Timeouts are layered: ``rank_timeout`` (15 s) < the run's timeout (capped by the test's deadline,
``tests/torchrun_utils.py``) < pytest's timeout.
"""

import json
import os
import re
import signal
import time

import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import create_study, exit_env, exit_lines, exit_statuses, load
from tests.torchrun_utils import base_env, kill_tree, run_torchrun, start_process, time_left, torchrun_command, \
    wait_process

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(400)]

APP = "tests/apps/skip_call_app.py"
PLAN_APP = "tests/apps/fault_plan_app.py"
PLAN_STUDY = "fault_plan_app"
C, F = TrialState.COMPLETE, TrialState.FAIL
RANK_TIMEOUT_S = 15
#: Words a message must not use when no rank died.
DIED = re.compile(r"lost a peer|died|a rank process", re.I)


def _args(tmp_path, *overrides):
    return ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.sweeper.rank_timeout={RANK_TIMEOUT_S}",
            "hydra.sweeper.max_failure_rate=1.0", "hydra.sweeper.plots=false", "x=interval(-1,1)", *overrides]


def _env(tmp_path):
    return {"DSO_RECORD_DIR": str(tmp_path / "records"), **exit_env(tmp_path)}


def _trial_seconds(study, number):
    t = study.trials[number]
    return (t.datetime_complete - t.datetime_start).total_seconds()


#: Trial -> the call rank 1 leaves out (rank 0 makes it) and the message that names rank 1 and the call.
SKIPPED = {
    # rank 1 skips report at step 0 and goes on to should_prune: the ranks' calls differ at once
    1: ("report", r"the ranks made different calls at call #1 of the task: rank 0 report\(step=0\), "
                  r"rank 1 should_prune\(\)"),
    2: ("should_prune", r"the ranks made different calls at call #2 of the task: rank 0 should_prune\(\), "
                        r"rank 1 report\(step=1\)"),
    # the pruning callback's shape: report and should_prune on rank 0 only
    3: ("report_and_prune", r"the ranks made different calls at call #1 of the task: rank 0 report\(step=0\), "
                            r"rank 1 suggest_float\('lr'\)"),
    # rank 1's task returns without the last call: rank 0 learns it from rank 1's end record
    4: ("suggest", r"rank 1 never called suggest_float\('lr'\) in trial 4; rank 0 did \(call #7 of the task\): "
                   r"rank 1's task returned after 6 of these calls"),
}


def test_c34_a_call_made_on_rank0_only_fails_the_trial_naming_rank_and_call(tmp_path, fault_record):
    """One launch (``tests/apps/fault_plan_app.py``, every trial reporting and asking should_prune at steps 0..2,
    then suggesting ``lr``): in trials 1-4 rank 1 leaves out one call (:data:`SKIPPED`); each trial fails
    within rank_timeout naming rank 1 and the call, never saying a rank died, and the sweep goes on. In trial 5
    rank 1 skips report and goes on into a training all_reduce (where no Python runs): rank 0 names rank 1 and
    the call after rank_timeout, or learns first that rank 1's task ended when the training group's own timeout
    (also rank_timeout) released rank 1's all_reduce; the trial is closed FAIL and the broken training group
    stops the group clearly (``TrainingGroupBrokenError``, with each rank's error from the group's probe)."""
    create_study(tmp_path, study_name=PLAN_STUDY)
    trials = {str(n): {"kind": "skip", "call": call} for n, (call, _) in SKIPPED.items()}
    trials["5"] = {"kind": "skip", "call": "report", "then": "collective"}
    env = {**_env(tmp_path), "DSO_FAULT_PLAN": json.dumps({"calls": True, "trials": trials})}
    res = run_torchrun(PLAN_APP, _args(tmp_path, "hydra.sweeper.n_trials=8"), timeout_s=240, extra_env=env)
    out = res.output
    study = load(tmp_path, study_name=PLAN_STUDY)
    assert [t.state for t in study.trials] == [C, F, F, F, F, F], out[-4000:]  # the sweep went on after each
    for number, (call, message) in SKIPPED.items():
        assert re.search(message, study.trials[number].system_attrs.get("fail_reason", "") + out), (call, out[-4000:])
        seconds = _trial_seconds(study, number)
        assert seconds < RANK_TIMEOUT_S, f"trial {number} told FAIL {seconds:.1f} s after it started"
    assert "CallMismatchError" in out
    assert re.search(rf"rank 1 never called report\(step=0\) in trial 5( within rank_timeout={RANK_TIMEOUT_S} s)?; "
                     r"rank 0 did \(call #1 of the task\)", out), out[-4000:]
    assert re.search(r"TrainingGroupBrokenError: trial 5 failed \([^\n]*\) and left the training process group broken: "
                     r"rank \d: ", out), out[-4000:]
    assert res.returncode != 0  # the broken group stops clearly
    assert not DIED.search(out), DIED.search(out)
    seconds = _trial_seconds(study, 5)
    assert seconds < RANK_TIMEOUT_S + 20, f"trial 5 told FAIL {seconds:.1f} s after it started"
    fault_record("4 calls skipped on rank 1 -> FAIL naming rank 1 and the call; skipped then a collective -> "
                 "named after rank_timeout", seconds)


def _interrupt(tmp_path, overrides, send, log_name):
    """Start the app under torchrun with ``overrides``, wait until both ranks are in trial 1's task, call
    ``send(proc, pid_files)`` and wait for torchrun's exit. Returns ``(rc, seconds from the signal to the
    exit, output)``."""
    create_study(tmp_path, study_name="skip_call_app")
    cmd = torchrun_command(APP, _args(tmp_path, "hydra.sweeper.n_trials=3", *overrides))
    log = tmp_path / log_name
    with open(log, "w") as out:
        proc = start_process(cmd, cwd=tmp_path, env=base_env(**_env(tmp_path)), stdout=out)
    try:
        left = time_left()
        deadline = time.monotonic() + (150 if left is None else min(150, left - 60))
        started = [tmp_path / "records" / f"started_trial1_rank{r}" for r in range(2)]
        while not all(p.exists() for p in started):
            assert time.monotonic() < deadline and proc.poll() is None, f"trial 1 never started\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        time.sleep(1.0)  # both ranks are in the task (or past it, in the gather)
        t0 = time.monotonic()
        send(proc, started)
        rc = wait_process(proc, timeout_s=60)
        seconds = time.monotonic() - t0
    finally:
        kill_tree(proc)
    return rc, seconds, log.read_text()


def test_c41_ctrl_c_to_the_group_every_rank_exits_130_and_says_so(tmp_path, fault_record):
    """SIGINT to torchrun's process group during trial 1: torchrun sends SIGINT to each rank; every rank exits
    130, trial 1 is closed FAIL, the resume command is on a line of its own, and no message says a rank died or
    a peer was lost. Rank 0 sleeps in the task while rank 1 already waits in the trial-result gather (a gloo
    wait, where its handler cannot run until the wait returns); a rank interrupted inside the task is rank 0
    here and rank 1 in the next test."""
    where = "in_gather"
    wait = ["+wait_s=300", "+wait_rank=0", "+wait_at=end"]
    # Ctrl-C in a terminal: torchrun's whole process group
    rc, seconds, output = _interrupt(tmp_path, wait, lambda proc, _: os.killpg(proc.pid, signal.SIGINT), "ctrl_c.log")
    statuses, lines = exit_statuses(tmp_path), exit_lines(tmp_path)
    assert statuses == {0: 130, 1: 130}, (lines, output[-4000:])
    assert rc != 0
    study = load(tmp_path, study_name="skip_call_app")
    assert [t.state for t in study.trials] == [C, F], output[-4000:]
    assert re.search(r"Resume the study with:\n\S[^\n]*skip_call_app\.py", output), output[-4000:]
    assert "The sweep stopped: SIGINT (Ctrl-C) received by rank(s) [0" in output, output[-4000:]
    assert re.search(r"rank 1/2 stops: SIGINT \(Ctrl-C\) received by rank\(s\) \[[01, ]+\]; exit status 130", output), \
        output[-4000:]
    assert not DIED.search(output), DIED.search(output)
    assert seconds < 30, f"{seconds:.1f} s from Ctrl-C to torchrun's exit (torchrun kills after 30 s)"
    fault_record(f"Ctrl-C, {where} -> every rank exits 130, trial closed", seconds,
                 measured="seconds from SIGINT to torchrun's exit")


@pytest.mark.soak  # the lean net's 12 min; make test keeps Ctrl-C to the group (above)
def test_c41_ctrl_c_to_one_rank_while_its_peer_is_blocked_every_rank_exits_130(tmp_path, fault_record):
    """SIGINT to rank 1 alone while rank 0 sits in a training ``all_reduce`` rank 1 never joins (found by a
    new-user trial: Ctrl-C landing in a call the other rank was blocked in was announced as a task failure,
    and the group ended 10 s later with status 1). Rank 1 waits at the result gather for rank 0, which is still
    blocked 2 s later (``_exits.INTERRUPT_GRACE_S``): rank 1 ends the launch with status 130, rank 0 closes trial 1
    from its record and exits 130 too, well before ``rank_timeout``, with the resume command on its own line and no
    word of a rank dying."""
    # rank 0 is in the all_reduce, rank 1 sleeps in the task
    rc, seconds, output = _interrupt(
        tmp_path, ["+wait_s=300", "+wait_rank=1", "+others_collective=true"],
        lambda _, started: os.kill(int(started[1].read_text()), signal.SIGINT), "ctrl_c_one.log")
    statuses, lines = exit_statuses(tmp_path), exit_lines(tmp_path)
    assert statuses == {0: 130, 1: 130}, (lines, output[-4000:])
    assert rc != 0
    study = load(tmp_path, study_name="skip_call_app")
    assert [t.state for t in study.trials] == [C, F], output[-4000:]
    assert "rank 1 was interrupted by SIGINT (Ctrl-C) in trial 1" in output, output[-4000:]
    # torchrun's summary names the rank that ended the launch as the root cause (its error file), not rank 0, whose
    # collective broke a few ms after rank 1 left (found by a new-user trial)
    root = output[output.index("Root Cause (first observed failure)"):]
    root = root[:root.index("=" * 20)]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)", root) and "and ended the launch" in root, root
    assert re.search(r"Resume the study with:\n\S[^\n]*skip_call_app\.py", output), output[-4000:]
    assert not DIED.search(output), DIED.search(output)
    assert seconds < RANK_TIMEOUT_S, f"{seconds:.1f} s from SIGINT to torchrun's exit (rank_timeout {RANK_TIMEOUT_S} s)"
    fault_record("Ctrl-C to rank 1 while rank 0 is blocked -> every rank exits 130", seconds,
                 measured="seconds from SIGINT to torchrun's exit")
