"""Promotion ASHA and PBT (issue 41) across real torchrun ranks: ``tests/apps/rung_app.py`` pauses at its rungs through
``should_preempt()`` and resumes from its checkpoint, on 2 ranks and with 2 trial groups of 2 ranks (``n_jobs=2``).
The promotion rule itself is tabled in ``tests/test_asha.py``.
"""

from __future__ import annotations

import datetime
import json
import re
import signal
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import jsonl_by
from tests.torchrun_utils import base_env, run_torchrun, start_process, torchrun_command, wait_process

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(240)]

APP = "tests/apps/rung_app.py"
#: x=0.3 is the best point: with eta 3, the third configuration at rung 1 makes it the top third.
WARM = "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9},{x:0.5}]"


def _sweep(tmp_path: Path, nproc: int, *overrides: str) -> optuna.Study:
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=30",
            WARM, *overrides]
    run_torchrun(APP, args, nproc=nproc, timeout_s=180, extra_env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()
    return optuna.load_study(study_name="rung_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")


def _runs(tmp_path: Path) -> dict[int, list[dict]]:
    """``{trial: [each rank's run record]}`` (a trial group's ranks are its ranks 0 and 1)."""
    return jsonl_by(tmp_path / "records", "runs_rank*.jsonl", "trial")


def _paused_runs(tmp_path: Path) -> int:
    """Runs that paused so far (rank 0's records; 0 while a line is half written)."""
    try:
        return sum(r[0]["paused"] for r in _runs(tmp_path).values())
    except ValueError:
        return 0


def _finished_searches(output: str) -> dict[int, datetime.datetime]:
    """``{trial group: when it logged "Trial group k/K finished its search"}`` from a launch's output."""
    found = re.findall(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\][^\n]*? Trial group (\d+)/\d+ finished its search", output)
    assert found, output[-3000:]
    return {int(g): datetime.datetime.strptime(at, "%Y-%m-%d %H:%M:%S,%f") for at, g in found}


def _check_continuations(study: optuna.Study, runs: dict[int, list[dict]], n_configurations: int) -> None:
    trials = {t.number: t for t in study.get_trials()}
    assert all(len(r) == 2 and r[0] == r[1] for r in runs.values()), runs  # both ranks ran the same steps
    continued = [t for t in trials.values() if t.system_attrs.get("retry_history")]
    assert [t.system_attrs["retry_history"] for t in continued][:1] == [[0]], trials
    for t in continued:
        parent = t.system_attrs["retry_history"][-1]
        assert runs[t.number][0]["start"] == runs[parent][0]["last"] + 1 > 0, (t.number, runs)
        assert trials[parent].state == TrialState.PRUNED
    assert len({(t.system_attrs.get("retry_history") or [t.number])[0] for t in trials.values()}) == n_configurations


def test_asha_pauses_and_resumes_a_trial_at_the_step_it_paused_on_two_ranks(tmp_path):
    study = _sweep(tmp_path, 2, "hydra.sweeper.n_trials=4")
    _check_continuations(study, _runs(tmp_path), 4)


@pytest.mark.soak  # the lean net's 12 min; make test keeps ASHA on two ranks (above)
def test_asha_with_two_trial_groups_resumes_the_promoted_trial_in_whichever_group_is_free(tmp_path):
    study = _sweep(tmp_path, 4, "hydra.sweeper.n_trials=5", "hydra.sweeper.n_jobs=2")
    _check_continuations(study, _runs(tmp_path), 5)
    assert {t.user_attrs.get("ds_optuna:trial_group") for t in study.get_trials()} == {0, 1}


@pytest.mark.soak  # the lean net's 12 min; make test keeps ASHA's pause and resume (above)
def test_sigterm_while_trials_are_paused_then_the_same_command_promotes_them_and_loses_none(tmp_path):
    """SIGTERM to torchrun once three trials paused (the first of them being promoted, or about to be); the same
    command then finishes the search: no trial RUNNING, four configurations, and the best point (x=0.3, paused by
    the first launch) runs to the end."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=30",
            WARM, "hydra.sweeper.n_trials=4", "sleep_s=0.2"]
    env = base_env(DSO_RECORD_DIR=str(tmp_path / "records"))
    with open(tmp_path / "first.log", "w") as out:
        proc = start_process(torchrun_command(APP, args, nproc=2), cwd=tmp_path, env=env, stdout=out)
    deadline = time.monotonic() + 120
    while _paused_runs(tmp_path) < 3:
        assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    wait_process(proc, 60)
    study = optuna.load_study(study_name="rung_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    assert TrialState.RUNNING not in {t.state for t in study.get_trials()}
    study = _sweep(tmp_path, 2, "hydra.sweeper.n_trials=4", "sleep_s=0.2")
    trials = study.get_trials()
    assert TrialState.RUNNING not in {t.state for t in trials}, trials
    assert len({(t.system_attrs.get("retry_history") or [t.number])[0] for t in trials}) == 4
    best = [t for t in trials if t.state == TrialState.COMPLETE and t.params["x"] == 0.3]
    assert best and sorted(best[0].intermediate_values) == list(range(9)), trials


def test_pbt_of_the_ddp_example_clones_the_top_members_weights_with_its_new_learning_rate_in_effect(tmp_path):
    """PBT with 4 members of ``examples/ddp_mlp.py`` on 2 ranks (pauses every 2 epochs of 6, only lr mutable,
    perturbed): a bottom member's next interval starts from the top member's weights (the hash of the weights it
    loaded equals the hash the donor saved, on both ranks) with its new learning rate in the optimizer's param
    groups (not the donor's, which the optimizer's state held); every member ends COMPLETE at the last epoch."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=60",
            "hydra/sweeper/pruner=nop", "hydra/sweeper/scheduler=pbt", "hydra.sweeper.scheduler.interval=2",
            "hydra.sweeper.scheduler.max_steps=6", "hydra.sweeper.scheduler.mutations=[lr]",
            "hydra.sweeper.scheduler.resample_probability=0", "hydra.sweeper.n_trials=4", "epochs=6"]
    records = tmp_path / "records"
    run_torchrun("examples/ddp_mlp.py", args, nproc=2, timeout_s=200, extra_env={"DSO_RECORD_DIR": str(records)}).check()
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    trials = {t.number: t for t in study.get_trials()}
    rec = {(r["trial_number"], r["rank"]): r for r in map(lambda p: json.loads(p.read_text()),
                                                           records.glob("trial*_rank*.json"))}
    clones = [t for t in trials.values() if t.user_attrs.get("ds_optuna:pbt_clone")]
    assert clones, sorted(trials)
    for t in clones:
        cloned = t.user_attrs["ds_optuna:pbt_clone"]
        donor = cloned["from_trial"]
        old, new = cloned["changed"]["lr"]
        assert old == trials[donor].params["lr"] and new == t.params["lr"] and new != old
        for rank in (0, 1):
            assert rec[(t.number, rank)]["start_sha256"] == rec[(donor, rank)]["saved_sha256"], (t.number, rank)
            assert rec[(t.number, rank)]["lr_in_effect"] == pytest.approx(new)
        assert {k: v for k, v in t.params.items() if k != "lr"} == {k: v for k, v in trials[donor].params.items()
                                                                     if k != "lr"}
    complete = [t for t in trials.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == 4 and all(max(t.intermediate_values) == 5 for t in complete)


@pytest.mark.soak  # make test: the DDP example's PBT launch above (the lean net's 12 min); CI runs this too
def test_pbt_of_an_hf_deepspeed_zero2_app_clones_from_the_trainers_checkpoint_with_the_new_learning_rate(tmp_path):
    """PBT with 4 members of the HF Trainer app under DeepSpeed ZeRO-2 on 2 ranks (pauses every 0.3 epoch): a
    clone's Trainer starts from the donor's ``checkpoint-<step>`` (the weights' hash equals the one the donor saved,
    on both ranks) and its first step runs at its own learning rate at the schedule's step (the Trainer loaded the
    donor's optimizer and scheduler state, which held the donor's: the glue sets the trial's), i.e. the linear
    decay's factor times the new rate where the donor ran the same factor times its own."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=60",
            "deepspeed=zero2", "hydra/sweeper/pruner=nop", "hydra/sweeper/scheduler=pbt",
            "hydra.sweeper.scheduler.interval=300", "hydra.sweeper.scheduler.max_steps=1000",
            "hydra.sweeper.scheduler.mutations=[training.learning_rate]", "hydra.sweeper.scheduler.resample_probability=0",
            "hydra.sweeper.n_trials=4", "training.learning_rate=tag(log,interval(1e-4,1e-2))"]
    records = tmp_path / "records"
    run_torchrun("tests/apps/hf_resume_app.py", args, nproc=2, timeout_s=200,
                 extra_env={"DSO_RECORD_DIR": str(records)}).check()
    study = optuna.load_study(study_name="hf_resume_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    trials = {t.number: t for t in study.get_trials()}
    rec = {}
    for path in records.glob("trial*_rank*.json"):
        number, rank = path.stem[len("trial"):].split("_rank")
        rec[(int(number), int(rank))] = json.loads(path.read_text())
    clones = [t for t in trials.values() if t.user_attrs.get("ds_optuna:pbt_clone")]
    assert clones, sorted(trials)
    key, stepped = "training.learning_rate", 0
    for t in clones:
        donor = t.user_attrs["ds_optuna:pbt_clone"]["from_trial"]
        new, old = t.params[key], trials[donor].params[key]
        assert new != old
        for rank in (0, 1):
            mine, theirs = rec[(t.number, rank)], rec[(donor, rank)]
            assert mine["start_sha256"] == theirs["saved_sha256"], (t.number, donor, rank)
            if "lr_in_effect" in mine:  # a clone of a checkpoint at the last step trains no step
                stepped += 1
                assert mine["lr_in_effect"] / new == pytest.approx(theirs["lr_at_save"] / old), (mine, theirs)
    assert stepped
    complete = [t for t in trials.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == 4


@pytest.mark.soak  # make test: the ASHA trial-group launch above and the two PBT launches (the lean net's 12 min)
def test_pbt_with_two_trial_groups_continues_each_member_where_it_or_its_donor_paused(tmp_path):
    """PBT with 4 members of rung_app on 2 trial groups of 2 ranks: every continuation, in whichever group is
    free, starts after the step its own trial (or, for a clone, its donor) paused at, from that checkpoint; every
    member ends COMPLETE at the last step; the budget counts 4 members. (Whether a bottom member finds a paused
    top member to clone depends on which group is faster; the clone rule is tabled in tests/test_pbt.py.)"""
    args = ["--config-name", "pbt", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false",
            "hydra.sweeper.rank_timeout=30", "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9},{x:0.5},{x:0.7}]",
            "hydra.sweeper.n_jobs=2", "sleep_s=0.05"]
    res = run_torchrun(APP, args, nproc=4, timeout_s=180, extra_env={"DSO_RECORD_DIR": str(tmp_path / "records")})
    res.check()
    study = optuna.load_study(study_name="rung_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    trials, runs = {t.number: t for t in study.get_trials()}, _runs(tmp_path)
    assert all(len(r) == 2 and r[0] == r[1] for r in runs.values()), runs
    # No group leaves its search while the other group's trial may still pause and be continued (it waits):
    # before, a group that found nothing to continue stopped for good and left the population to the other.
    for group, finished in _finished_searches(res.output).items():
        running = [t.number for t in trials.values() if t.user_attrs.get("ds_optuna:trial_group") != group
                   and t.datetime_start < finished < t.datetime_complete]
        assert not running, (group, finished, running)
    for t in trials.values():
        cloned, parent = t.user_attrs.get("ds_optuna:pbt_clone"), t.user_attrs.get("ds_optuna:continues")
        if parent is None:
            continue
        source = trials[cloned["from_trial"]] if cloned else trials[parent]
        assert runs[t.number][0]["start"] == source.user_attrs["ds_optuna:paused_at"] + 1, (t.number, runs)
        assert runs[t.number][0]["ckpt_x"] == source.params["x"]
    complete = [t for t in trials.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == 4 and all(max(t.intermediate_values) == 8 for t in complete), trials
    assert {t.user_attrs.get("ds_optuna:trial_group") for t in trials.values()} == {0, 1}
