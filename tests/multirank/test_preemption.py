"""Issue 24: a preempted or crashed trial resumes from its last checkpoint, under real torchrun on CPU.

- SIGTERM to torchrun during a 2-rank HF Trainer + DeepSpeed ZeRO-3 trial after its first
  checkpoint: every rank agrees on ``should_preempt()`` at the same step, the Trainer saves, the trial is
  stored INTERRUPTED (FAIL + ``ds_optuna:interrupted``) and re-queued, every rank exits 143; the same command
  then resumes it: the retry starts at the checkpoint's global step, trains exactly the remaining steps, keeps
  the interrupted attempt's intermediate values, and returns the value of the uninterrupted run (exact on CPU:
  same seed, the Trainer restores model, optimizer, scheduler, RNG states and the data position).
- ``kill -9`` of rank 1 under ``--max-restarts 1`` (ZeRO-2): the restarted group closes the trial and re-queues
  it (``retry_failed_trials=1``), the retry resumes from the newest periodic checkpoint, same value.
- The plain DDP example's three lines: the same resume from its own ``step=<n>.ckpt``.

``make test`` runs the HF SIGTERM resume (the preemption contract); the ZeRO-2 kill -9 resume, the DDP example's
own SIGTERM resume, the kill -9 inside a launch with two trial groups and the refit from a checkpoint run under
``make soak`` (issue 39). The retention rule after a pruned DDP sweep is asserted on the DDP example's launch in
``tests/multirank/test_examples.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import optuna
import pytest

from tests.torchrun_utils import REPO, TRAINING_ENV, _tagged_pids, base_env, kill_tree, start_process, torchrun_command, wait_process
from tests.tracking_readers import mlflow_history, mlflow_runs, tensorboard_scalars

pytestmark = pytest.mark.torchrun

HF_APP = "tests/apps/hf_resume_app.py"
DDP_APP = "examples/ddp_mlp.py"
#: The HF app's run: 160 samples / (micro batch 4 x accumulation 2 x 2 ranks) = 10 optimizer steps.
HF_STEPS = 10


def _launch(tmp_path: Path, script: str, name: str, args: list[str], torchrun_args: list[str] | None = None):
    """Start ``torchrun script -m args`` with its output in ``tmp_path/<name>.log``; returns (proc, log path)."""
    log_path = tmp_path / f"{name}.log"
    # the checkout's package first (not an installed copy elsewhere), then the apps' helpers
    env = base_env(DSO_RECORD_DIR=str(tmp_path / f"records_{name}"),
                   PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "apps")]), **TRAINING_ENV)
    out = log_path.open("w")
    proc = start_process(torchrun_command(script, ["-m", *args], torchrun_args=torchrun_args), cwd=REPO, env=env,
                         stdout=out)
    return proc, log_path


def _wait_for(check, timeout_s: float, proc, log_path: Path, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None or time.monotonic() > end:
            kill_tree(proc)
            raise AssertionError(f"{what} did not happen (rc {proc.returncode}):\n{log_path.read_text()[-4000:]}")
        time.sleep(0.1)


def _records(tmp_path: Path, name: str) -> dict[int, dict]:
    """``{trial number: rank 0's record}`` of a run of the HF app."""
    out = {}
    for path in sorted((tmp_path / f"records_{name}").glob("trial*_rank0.json")):
        out[int(path.name[len("trial"):].split("_")[0])] = json.loads(path.read_text())
    return out


def _run(tmp_path: Path, script: str, name: str, args: list[str], timeout_s: float = 180) -> str:
    proc, log_path = _launch(tmp_path, script, name, args)
    rc = wait_process(proc, timeout_s)
    text = log_path.read_text()
    assert rc == 0, text[-4000:]
    return text


def _hf_args(tmp_path: Path, zero: str, sweep: str, *extra: str) -> list[str]:
    return [f"hydra.sweep.dir={tmp_path / sweep}", f"deepspeed={zero}", "hydra.sweeper.rank_timeout=60",
            "hydra.sweeper.plots=false", *extra]


_REFERENCES: dict[str, dict] = {}


def _reference(tmp_path: Path, zero: str) -> dict:
    """Rank 0's record of the uninterrupted HF run at ``zero`` (the ``kill -9`` test's; run once per stage)."""
    if zero not in _REFERENCES:
        _run(tmp_path, HF_APP, "reference", _hf_args(tmp_path, zero, "reference"))
        _REFERENCES[zero] = _records(tmp_path, "reference")[0]
    return _REFERENCES[zero]


def _checkpoint_steps(directory: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in directory.glob("checkpoint-*") if (p / "trainer_state.json").exists())


@pytest.mark.timeout(420)
@pytest.mark.parametrize("zero", ["zero3"])  # ZeRO-2's resume: the kill -9 test below (same Trainer save path)
def test_sigterm_hf_deepspeed_trial_resumes_from_its_checkpoint(tmp_path: Path, zero: str) -> None:
    """The preemption contract. The uninterrupted run to compare with is the study's next trial (the search space
    is one point, ``n_trials=2``: the retry of trial 0 replaces it in the budget, then trial 2 trains the same
    params from step 0 in the same process), not a launch of its own (issue 39)."""
    # Tracking (issue 25): the Trainer's own MLflow and TensorBoard curves land in the trial's run, and the retry
    # continues that run.
    args = _hf_args(tmp_path, zero, "sweep", "hydra.sweeper.n_trials=2",
                    "hydra.sweeper.tracking.report_to=[mlflow,tensorboard]",
                    "+training.report_to=[mlflow,tensorboard]", "training.logging_strategy=steps",
                    "+training.logging_steps=1")
    proc, log_path = _launch(tmp_path, HF_APP, "first", [*args, "step_sleep_s=0.7"])
    ckpt_dir = tmp_path / "sweep" / "checkpoints" / "trial0"
    _wait_for(lambda: _checkpoint_steps(ckpt_dir), 150, proc, log_path, "the first periodic checkpoint")
    os.kill(proc.pid, signal.SIGTERM)  # torchrun passes it to every rank, as SLURM's scancel or a spot notice would
    wait_process(proc, 60)
    text = log_path.read_text()
    assert "Every rank exits with status 143" in text, text[-4000:]
    assert "Trial 0 INTERRUPTED" in text and "re-queued as trial 1" in text, text[-4000:]
    stopped = _records(tmp_path, "first")[0]
    saved = _checkpoint_steps(ckpt_dir)
    assert saved == [stopped["ran"]], (saved, stopped)  # the preemption checkpoint, the older one rotated out
    assert 3 <= saved[0] < HF_STEPS

    study = optuna.load_study(study_name="hf_resume_app", storage=f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}")
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.FAIL and "preempted" in first.user_attrs["ds_optuna:interrupted"]
    assert study.trials[1].state == optuna.trial.TrialState.WAITING

    text = _run(tmp_path, HF_APP, "first", args)  # the same command resumes the study
    reference = _records(tmp_path, "first")[2]  # the same params, uninterrupted
    assert reference["first_step"] == 0 and reference["ran"] == HF_STEPS
    resumed = _records(tmp_path, "first")[1]
    assert resumed["first_step"] == saved[0], (resumed, saved)  # from the checkpoint's global step, not 0
    assert resumed["ran"] == HF_STEPS - saved[0]  # exactly the remaining steps
    assert resumed["value"] == reference["value"]  # bit for bit: the uninterrupted run's value
    study = optuna.load_study(study_name="hf_resume_app", storage=f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}")
    retry = study.trials[1]
    assert retry.state == optuna.trial.TrialState.COMPLETE and retry.value == reference["value"]
    assert retry.user_attrs["ds_optuna:continues"] == 0
    assert retry.user_attrs["ds_optuna:resumed_from"].endswith(f"checkpoint-{saved[0]}")
    assert study.trials[2].state == optuna.trial.TrialState.COMPLETE and "ds_optuna:continues" not in study.trials[2].user_attrs
    assert set(first.intermediate_values) <= set(retry.intermediate_values)  # the whole curve, pre-interruption too
    assert _checkpoint_steps(ckpt_dir) == [HF_STEPS]  # retention: the best trial keeps its newest checkpoint only
    _check_one_tracked_run(tmp_path / "sweep", retry, saved[0])


def _check_one_tracked_run(sweep: Path, retry: optuna.trial.FrozenTrial, resumed_at: int) -> None:
    """One MLflow run and one TensorBoard dir for trial 0 and its retry, holding the sweeper's values and the
    Trainer's own curves from both attempts."""
    uri = f"sqlite:///{sweep}/mlflow.db"
    runs = [r for r in mlflow_runs(uri, "hf_resume_app") if r.data.tags.get("ds_optuna.kind") != "study"]
    # one run for trial 0 and its retry (and one for the uninterrupted trial 2), no run of the Trainer's own; named
    # after the attempt that wrote its end (C59)
    assert sorted(r.info.run_name for r in runs) == ["trial-1 (resumes trial-0)", "trial-2"], [
        r.info.run_name for r in runs]
    run = next(r for r in runs if r.info.run_name == "trial-1 (resumes trial-0)")
    assert run.data.tags["ds_optuna.resumed_by_trial"] == "1" and run.data.tags["ds_optuna.state"] == "COMPLETE"
    assert "ds_optuna.error" not in run.data.tags  # the interrupted attempt's error is not the retry's (C59)
    assert run.info.status == "FINISHED" and run.data.metrics["value"] == retry.value
    assert mlflow_history(uri, run.info.run_id, "intermediate_value") == retry.intermediate_values
    loss_steps = set(mlflow_history(uri, run.info.run_id, "loss"))  # the Trainer's MLflowCallback, both attempts
    assert min(loss_steps) <= resumed_at < max(loss_steps), loss_steps
    assert "learning_rate" in run.data.params  # the Trainer's arguments, logged by its callback into this run
    scalars = tensorboard_scalars(sweep / "tensorboard" / "trial_0")
    assert scalars["intermediate_value"] == pytest.approx(retry.intermediate_values, rel=1e-6)
    assert min(scalars["train/loss"]) <= resumed_at < max(scalars["train/loss"]), scalars["train/loss"]
    assert sorted(p.name for p in (sweep / "tensorboard").iterdir()) == ["trial_0", "trial_2"]


def _rank_pid(tag: str, rank: int) -> int | None:
    """The pid of the worker with ``RANK=rank`` among the processes carrying ``tag`` (not torchrun itself)."""
    for pid in _tagged_pids(tag):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RESTART_COUNT=0" in env:
            return pid
    return None


@pytest.mark.soak  # make test: the HF SIGTERM resume above (issue 39: one launch pair per contract)
@pytest.mark.timeout(360)
def test_kill9_of_rank1_under_max_restarts_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    reference = _reference(tmp_path, "zero2")
    # Rank 0's task, aware of preemption, gets torchrun's SIGTERM while rank 1 is dead: no peer can agree on
    # should_preempt(), so after the grace SIGTERM acts as before (rank 0 closes the trial, re-queued).
    args = _hf_args(tmp_path, "zero2", "sweep", "hydra.sweeper.retry_failed_trials=1",
                    "hydra.sweeper.checkpoints.preempt_grace=3")
    # Rank 1 stalls once after the first periodic checkpoint, before its should_preempt() call, and is killed
    # there: rank 0 then waits in should_preempt() (not in a gloo collective, which would see the dead peer and
    # fail the task before torchrun's SIGTERM, as on a slow CI host).
    proc, log_path = _launch(tmp_path, HF_APP, "run", [*args, "step_sleep_s=0.4", "stall_rank=1", "stall_s=60"],
                             torchrun_args=["--max-restarts", "1"])
    marker = tmp_path / "records_run" / "stalled_rank1"
    _wait_for(marker.exists, 150, proc, log_path, "rank 1 stalled after the first periodic checkpoint")
    pid = _rank_pid(proc.dso_tag, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    # The restarted attempt runs with step_sleep_s=0.4 too: 10 steps at most, well inside the limit.
    rc = wait_process(proc, 200)
    text = log_path.read_text()
    assert rc == 0, text[-5000:]
    assert "did not stop on should_preempt() within 3 s of SIGTERM" in text, text[-5000:]
    records = _records(tmp_path, "run")
    retry_number = max(records)
    assert retry_number >= 1
    resumed = records[retry_number]
    assert resumed["first_step"] >= 3, resumed  # from a periodic checkpoint, not from step 0
    assert resumed["first_step"] + resumed["ran"] == HF_STEPS
    assert resumed["value"] == reference["value"]
    study = optuna.load_study(study_name="hf_resume_app", storage=f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}")
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    assert study.trials[retry_number].user_attrs["ds_optuna:continues"] == 0
    assert study.best_value == reference["value"]


@pytest.mark.soak  # make test: the HF SIGTERM resume above (issue 39: one launch pair per contract)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["SIGTERM", "ctrl_c"])
def test_sigterm_ddp_example_resumes_from_its_own_checkpoint(tmp_path: Path, how: str) -> None:
    """SIGTERM to torchrun, or Ctrl-C (SIGINT to its process group: every rank gets it from the terminal and
    again from torchrun's agent): the example saves at its next ``should_preempt()``, the trial is re-queued,
    every rank exits 143 or 130, and the same command resumes from the checkpoint with the uninterrupted run's
    value (issue 40: SIGTERM and SIGINT set one flag)."""
    base = ["hydra.sweeper.n_trials=1", "epochs=4", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=60",
            "model.n_layers=choice(2)", "lr=choice(0.01)"]
    text = _run(tmp_path, DDP_APP, "reference", [f"hydra.sweep.dir={tmp_path / 'reference'}", *base])
    reference = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{tmp_path / 'reference' / 'optuna.db'}")

    args = [f"hydra.sweep.dir={tmp_path / 'sweep'}", *base]
    proc, log_path = _launch(tmp_path, DDP_APP, "run", [*args, "step_sleep_s=0.1"])
    _wait_for(lambda: "epoch 1: val accuracy" in log_path.read_text(), 150, proc, log_path, "epoch 1")
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    wait_process(proc, 60)
    text = log_path.read_text()
    said = "SIGTERM during the trial" if how == "SIGTERM" else "SIGINT (Ctrl-C) during the trial"
    assert f"{said}: trial(s) [0] stopped on should_preempt() and were re-queued" in text, text[-4000:]
    assert f"Every rank exits with status {143 if how == 'SIGTERM' else 130}" in text, text[-4000:]
    assert "KeyboardInterrupt" not in text, text[-4000:]
    saved = list((tmp_path / "sweep" / "checkpoints" / "trial0").glob("step=*.ckpt"))
    assert len(saved) == 1
    step = int(saved[0].stem.split("=")[1])
    assert step >= 40  # after epoch 1 (20 steps per epoch at 2 ranks)

    text = _run(tmp_path, DDP_APP, "run", args)
    assert f"from step {step}" in text, text[-3000:]
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}")
    retry = study.trials[1]
    assert retry.state == optuna.trial.TrialState.COMPLETE
    assert retry.value == reference.trials[0].value
    assert retry.intermediate_values == reference.trials[0].intermediate_values  # epochs 0-1 kept, 2-3 reported


@pytest.mark.soak  # make test: the kill -9 contract (tests/faults) and the trial-groups one (issue 39)
@pytest.mark.timeout(300)
def test_kill9_inside_a_launch_with_two_trial_groups_resumes_both_trials(tmp_path: Path) -> None:
    """``n_jobs=2`` on 2 ranks: two trial groups of one rank train a trial each; ``kill -9`` of global rank 1
    (group 1). torchrun SIGTERMs rank 0, whose trial stops on ``should_preempt()`` (saved, INTERRUPTED,
    re-queued); the restarted launch closes group 1's killed trial and re-queues it (``retry_failed_trials=1``);
    both retries resume from their trial's checkpoint and the study ends with two COMPLETE trials."""
    sweep = tmp_path / "sweep"
    args = [f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2", "epochs=4",
            "save_every=1", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=60",
            "hydra.sweeper.retry_failed_trials=1", "hydra/sweeper/pruner=nop", "step_sleep_s=0.1",
            "hydra.sweeper.checkpoints.preempt_grace=3"]  # global rank 0 waits that long for the dead group
    proc, log_path = _launch(tmp_path, DDP_APP, "run", args, torchrun_args=["--max-restarts", "1"])
    ckpts = sweep / "checkpoints"
    _wait_for(lambda: len(list(ckpts.glob("trial*/step=*.ckpt"))) >= 2, 150, proc, log_path, "a checkpoint per trial")
    pid = _rank_pid(proc.dso_tag, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    rc = wait_process(proc, 200)
    text = log_path.read_text()
    assert rc == 0, text[-5000:]
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep / 'optuna.db'}")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 2, [(t.number, t.state) for t in study.trials]
    assert sorted(t.user_attrs["ds_optuna:continues"] for t in complete) == [0, 1]
    for t in complete:
        assert "ds_optuna:resumed_from" in t.user_attrs, t.user_attrs
        start = int(Path(t.user_attrs["ds_optuna:resumed_from"]).stem.split("=")[1])
        assert start > 0 and f"trial {t.number}: widths" in text and f"from step {start}" in text


@pytest.mark.soak  # make test: the HF SIGTERM resume above (issue 39: one launch pair per contract)
@pytest.mark.timeout(240)
def test_refit_from_checkpoint_starts_from_the_best_trials_newest_checkpoint(tmp_path: Path) -> None:
    """``refit.from_checkpoint=true``: the refit of the best trial gets ``resume_from`` = that trial's newest
    checkpoint (the DDP example's last epoch), so it trains nothing more and returns the trial's accuracy."""
    sweep = tmp_path / "sweep"
    text = _run(tmp_path, DDP_APP, "sweep", [
        f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "epochs=2", "save_every=1", "hydra.sweeper.plots=false",
        "hydra.sweeper.refit.enabled=true", "hydra.sweeper.refit.from_checkpoint=true"])
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep / 'optuna.db'}")
    best = study.best_trial
    assert f"refit.from_checkpoint: the refit of trial {best.number} starts from" in text, text[-3000:]
    assert "from step 40" in (sweep / "refit" / str(best.number) / "ddp_mlp_rank0.log").read_text()
    import yaml

    refit = yaml.safe_load((sweep / "optimization_results.yaml").read_text())["refit"]
    assert refit[0]["trial"] == best.number and refit[0]["metrics"]["value"] == best.value
