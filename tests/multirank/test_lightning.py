"""PyTorch Lightning under the sweeper (``examples/lightning_mlp.py``): one torchrun world of 2 ranks,
one ``Trainer`` per trial with Lightning's DDP strategy on CPU/gloo.

The sweep test runs the README's sweep (12 trials, median pruner; 6 epochs instead of 12) through ``tests/apps/lightning_fault_app.py``
with no fault (the example's ``run_trial`` plus a memory probe at the start of each trial) and per-rank
records (``DSO_RECORD_DIR``), and asserts case C01 (every trial ran the same params and the same resolved
config on both ranks), that every pruned trial stopped both ranks after the same epoch, and C14's memory
criteria (``tests/multirank/memory_checks.py``): no more live parameters, tensors, modules or hooks after
any trial than after the first, glibc's heap in use after each trial within 5% of after the first, and no
slope of resident memory over the trials. The fault test fails rank 1 mid-fit: rank 0 waits in DDP's
gradient all-reduce, learns of rank 1's failure at once and, still blocked after the grace, closes the
trial FAIL and ends the group (case C45), and torchrun's restart resumes the sweep: in ``make test`` both
are one launch (issue 39), the failure in the last trial. The SIGTERM tests (``make soak``) stop the group while
both ranks block inside ``fit`` (``fault.kind=block``), or preempt a trial mid-fit, and resume it.
"""

import json
import re
import subprocess
import time

import optuna
import pytest
from optuna.trial import TrialState

from tests.multirank.memory_checks import assert_memory_flat, assert_no_object_growth
from tests.torchrun_utils import REPO, base_env, kill_tree, run_torchrun, start_process, torchrun_command, wait_process
from tests.tracking_readers import mlflow_history, mlflow_runs, tensorboard_scalars

FAULT_APP = "tests/apps/lightning_fault_app.py"

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(420)]

C, P, F = TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL
#: The trial whose rank 1 raises mid-fit in the one make-test launch: the last, so the memory probes of trials
#: 1..11 (each at a trial's start) all come from the first torchrun attempt.
FAILED = 11
#: Epochs per trial in the make-test launch (the README's sweep trains 12; 6 keep the median pruner's verdicts
#: and halve the launch, the slowest of make test).
EPOCHS = 6


def _study(sweep):
    return optuna.load_study(study_name="lightning_mlp", storage=f"sqlite:///{sweep}/optuna.db")


def _records(record_dir):
    out = {}
    for path in record_dir.glob("trial*_rank*.json"):
        record = json.loads(path.read_text())
        out[record["trial_number"], record["rank"]] = record
    return out


def test_lightning_sweep_same_config_on_every_rank_prunes_alike_fails_alike_and_keeps_memory_flat(tmp_path):
    """THE Lightning launch: the README's sweep of 12 trials; rank 1 raises mid-fit in the last one
    (``--max-restarts 1``): rank 0, blocked in the gradient all-reduce, learns of it, the trial is closed FAIL
    (case C45) and torchrun's restart finds the budget spent and ends the sweep."""
    sweep, record_dir, memory_dir = tmp_path / "sweep", tmp_path / "records", tmp_path / "memory"
    record_dir.mkdir()
    memory_dir.mkdir()
    res = run_torchrun(FAULT_APP, ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.plots=false",
                                   "hydra.sweeper.rank_timeout=15", "+fault.rank=1", f"+fault.trial={FAILED}",
                                   "+fault.step=1", "hydra.job.name=lightning_mlp", f"epochs={EPOCHS}"], timeout_s=360,  # the example's log names
                       extra_env={"DSO_RECORD_DIR": str(record_dir), "DSO_MEMORY_DIR": str(memory_dir)},
                       torchrun_args=["--max-restarts", "1"]).check()
    trials = _study(sweep).trials
    assert len(trials) == 12 and trials[FAILED].state == F, [t.state for t in trials]
    trials = trials[:FAILED]
    assert {t.state for t in trials} <= {C, P}, [t.state for t in trials]
    pruned = [t for t in trials if t.state == P]
    assert pruned, "the median pruner stopped no trial in 11"
    records = _records(record_dir)
    assert sorted(records) == sorted((t.number, r) for t in trials for r in (0, 1))  # none of the failed trial
    for t in trials:
        rank0, rank1 = records[t.number, 0], records[t.number, 1]
        # C01: one set of params (including the widths suggested inside the task) and one resolved config.
        assert rank0["params"] == rank1["params"] == t.params
        assert rank0["config_sha256"] == rank1["config_sha256"]
        assert len(rank0["widths"]) == t.params["model.n_layers"]
        assert rank0["global_step"] == rank1["global_step"] and rank0["pruned_at"] == rank1["pruned_at"]
        assert rank0["val_acc"] == rank1["val_acc"]  # sync_dist: the logged metric is the same on both ranks
        assert t.user_attrs["optimizer_steps"] == rank0["global_step"]
    for t in pruned:
        # Both ranks left fit after the epoch of the verdict, the last step reported.
        assert records[t.number, 0]["pruned_at"] == max(t.intermediate_values)
        assert len(t.intermediate_values) < EPOCHS
        for rank in (0, 1):
            text = (sweep / str(t.number) / f"lightning_mlp_rank{rank}.log").read_text()
            assert re.findall(rf"trial {t.number} pruned at epoch (\d+)", text) == [str(max(t.intermediate_values))]
    for t in trials:
        if t.state == C:
            assert len(t.intermediate_values) == EPOCHS and records[t.number, 0]["pruned_at"] is None
    # The verdict saves the rest of the fit: a pruned trial ran (pruned_at + 1) epochs of optimizer steps, not EPOCHS
    # (micro batch and data are the same in every trial, so every epoch has the same steps).
    complete = [t for t in trials if t.state == C]
    assert complete, [t.state for t in trials]
    per_epoch, rest = divmod(records[complete[0].number, 0]["global_step"], EPOCHS)
    assert per_epoch > 0 and rest == 0, records[complete[0].number, 0]
    for t in pruned:
        assert records[t.number, 0]["global_step"] == (records[t.number, 0]["pruned_at"] + 1) * per_epoch, t.number
    for rank in (0, 1):
        # Probed at the start of trials 1..11: after trials 0..10, each torn down.
        probes = [json.loads((memory_dir / f"memory_trial{n}_rank{rank}.json").read_text()) for n in range(1, 12)]
        series = {key: [p[key] for p in probes] for key in probes[0]}
        assert_no_object_growth(series, 1, f"rank {rank}")  # no model, tensor or hook outlives its trial
        assert_memory_flat(series["heap_in_use_mib"], series["rss_mib"], f"rank {rank}")
        # The example keeps its Trainer in a local of run_trial: the survivors of trial 0 are frozen when trial 1
        # starts (freeze_survivors_once), so later collections skip torch's and Lightning's ~600,000 objects.
        assert all(frozen > 0 for frozen in series["gc_frozen"][1:]), f"rank {rank}: {series['gc_frozen']}"
    assert "Seed set to" not in res.output  # seed_everything(verbose=False) on every trial
    # Rank 1's own error; rank 0 blocked in the gradient all-reduce, so rank 1 ends the launch and rank 0 closes the
    # trial from its record (case C45).
    assert f"rank 1/2, trial {FAILED} failed:\nTraceback (most recent call last)" in res.output, res.output[-3000:]
    assert f"rank 1/2 ends the launch: it failed trial {FAILED} (RuntimeError: injected failure on rank 1)" in res.output
    assert re.search(rf"Trial\(s\) \[{FAILED}\] marked FAIL \(rank 1 failed trial {FAILED} \(RuntimeError: injected "
                     rf"failure on rank 1\) and ended the launch", res.output), res.output[-3000:]


@pytest.mark.soak  # make test: the Lightning launch above; SIGTERM/preemption: test_preemption.py (issue 39)
def test_lightning_sigterm_mid_fit_closes_the_trial_and_the_same_command_resumes(tmp_path):
    """SIGTERM to torchrun while both ranks are inside ``fit`` (Lightning's own SIGTERM handler, which
    broadcasts inside the handler, is set aside by the callback): trial 1 is closed FAIL (SIGTERM), the
    resume hint is printed, and the same command finishes the study."""
    sweep, marks = tmp_path / "sweep", tmp_path / "marks"
    marks.mkdir()
    args = ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.plots=false", "hydra.sweeper.n_trials=3", "epochs=2",
            "hydra.sweeper.rank_timeout=30"]
    # The ranks block where the task never checks should_preempt() (trial 0 made them aware): after the grace,
    # SIGTERM acts as for a task that does not check.
    cmd = torchrun_command(FAULT_APP, args + ["+fault.kind=block", "+fault.trial=1", "+fault.step=3",
                                              "hydra.sweeper.checkpoints.preempt_grace=2"])
    log = tmp_path / "preempted.log"
    with open(log, "w") as out:
        proc = start_process(cmd, cwd=REPO, env=base_env(DSO_MARK_DIR=str(marks)), stdout=out)
    try:
        deadline = time.monotonic() + 120
        while not (marks / "in_fit").exists():
            assert time.monotonic() < deadline and proc.poll() is None, f"trial 1 never trained\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
        # Both ranks now block inside fit until the signal (fault.kind=block), however slow the machine.
        proc.terminate()  # SIGTERM to torchrun, which passes it on to its ranks (as on preemption)
        try:
            wait_process(proc, timeout_s=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 60 s after SIGTERM\n{log.read_text()[-3000:]}") from None
    finally:
        kill_tree(proc)
    output = log.read_text()
    assert [t.state for t in _study(sweep).trials] == [C, F], output[-3000:]
    assert "did not stop on should_preempt() within 2 s of SIGTERM" in output, output[-3000:]
    assert "rank 0 received SIGTERM: closing the running trial and exiting" in output
    assert "Trial(s) [1] marked FAIL (SIGTERM)" in output
    assert "Received SIGTERM" not in output  # Lightning's handler did not run
    run_torchrun(FAULT_APP, args, timeout_s=120).check()
    assert [t.state for t in _study(sweep).trials] == [C, F, C]


@pytest.mark.soak  # make test: the Lightning launch above; SIGTERM/preemption: test_preemption.py (issue 39)
def test_lightning_trial_preempted_mid_fit_resumes_from_its_checkpoint(tmp_path):
    """Issue 24 with Lightning: SIGTERM while trial 0 trains (slowly, fault.kind=slow): the glue's callback sees
    ``should_preempt()`` on every rank after the same batch, saves ``step=<n>.ckpt`` in the trial's checkpoint
    dir and stops; the trial is stored INTERRUPTED and re-queued; the same command resumes it with
    ``ckpt_path``: its fit starts at the checkpoint's global step and runs to the same total. (Lightning
    restarts the interrupted epoch's data, so the value is not compared bit for bit.) With tracking (issue 25),
    Lightning's ``MLFlowLogger`` and ``TensorBoardLogger`` write into the trial's run, which the retry continues."""
    sweep, marks = tmp_path / "sweep", tmp_path / "marks"
    marks.mkdir()
    args = ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.plots=false", "hydra.sweeper.n_trials=1", "epochs=2",
            "hydra.sweeper.rank_timeout=30", "hydra/sweeper/pruner=nop", "loggers=[mlflow,tensorboard]",
            "hydra.sweeper.tracking.report_to=[mlflow,tensorboard]"]
    log = tmp_path / "preempted.log"
    cmd = torchrun_command(FAULT_APP, args + ["+fault.kind=slow", "+fault.trial=0", "+fault.step=3", "+fault.sleep=0.5"])
    with open(log, "w") as out:
        proc = start_process(cmd, cwd=REPO, env=base_env(DSO_MARK_DIR=str(marks)), stdout=out)
    try:
        deadline = time.monotonic() + 120
        while not (marks / "in_fit").exists():
            assert time.monotonic() < deadline and proc.poll() is None, f"trial 0 never trained\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
        time.sleep(1.0)
        proc.terminate()  # SIGTERM to torchrun, which passes it on to its ranks
        wait_process(proc, timeout_s=60)
    finally:
        kill_tree(proc)
    output = log.read_text()
    assert "Trial 0 INTERRUPTED" in output and "Every rank exits with status 143" in output, output[-3000:]
    saved = sorted((sweep / "checkpoints" / "trial0").glob("step=*.ckpt"))
    assert len(saved) == 1, output[-3000:]
    step = int(saved[0].stem.split("=")[1])
    assert step >= 3
    res = run_torchrun(FAULT_APP, args, timeout_s=150, extra_env={"DSO_MARK_DIR": str(marks)}).check()
    trials = _study(sweep).trials
    assert [t.state for t in trials] == [F, C], res.output[-3000:]
    assert trials[1].user_attrs["ds_optuna:continues"] == 0
    assert trials[1].user_attrs["ds_optuna:resumed_from"] == str(saved[0])
    assert (marks / "start_trial1_rank0").read_text() == str(step) == (marks / "start_trial1_rank1").read_text()
    runs = [r for r in mlflow_runs(f"sqlite:///{sweep}/mlflow.db", "lightning_mlp")
            if r.data.tags.get("ds_optuna.kind") != "study"]
    assert [r.info.run_name for r in runs] == ["trial-1 (resumes trial-0)"]  # no run of the logger's own (C59: named
    assert "ds_optuna.error" not in runs[0].data.tags  # after the retry, without the interrupted attempt's error)
    run = runs[0]
    assert run.data.tags["ds_optuna.resumed_by_trial"] == "1" and run.data.metrics["value"] == trials[1].value
    val_steps = set(mlflow_history(f"sqlite:///{sweep}/mlflow.db", run.info.run_id, "val_acc"))
    assert len(val_steps) >= 2 and max(val_steps) > step, val_steps  # MLFlowLogger's val_acc, in the trial's run
    assert "val_acc" in tensorboard_scalars(sweep / "tensorboard" / "trial_0")  # TensorBoardLogger: the trial's dir
