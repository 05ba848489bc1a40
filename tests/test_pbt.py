"""Population-based training (issue 41, ``hydra/sweeper/scheduler=pbt``): the exploit/explore rule over real Optuna
studies with checkpoints on disk, the settings it refuses, the learning rate a resumed HF run trains with, and
in-process sweeps of ``tests/apps/rung_app.py`` (world size 1; the 2-rank DDP run is
``tests/multirank/test_schedulers.py``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import optuna
import yaml
import pytest
import torch
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._glue._resume import apply_learning_rate
from hydra_plugins.ds_optuna_sweeper._loop._agree import Verdict
from hydra_plugins.ds_optuna_sweeper._loop._messages import TrialPayload
from hydra_plugins.ds_optuna_sweeper._loop._refit import RefitQueue
from hydra_plugins.ds_optuna_sweeper._scheduler_settings import Scheduler
from hydra_plugins.ds_optuna_sweeper._settings import Settings
from hydra_plugins.ds_optuna_sweeper._study import _pbt
from hydra_plugins.ds_optuna_sweeper._study._queue import counted_trials, lineage
from hydra_plugins.ds_optuna_sweeper._study._stored import CHECKPOINT_DIR_ATTR, NEVER_RAN_ATTR, PAUSED_ATTR, PBT_CLONE_ATTR
from tests.in_process import run_app

PBT = Scheduler("pbt", max_steps=9, interval=3, quantile=0.25, resample_probability=0.0, perturbation=(0.8, 1.2),
                mutations=("lr",))
DISTS = {"lr": FloatDistribution(1e-4, 1e-1, log=True), "layers": IntDistribution(1, 4)}


def _member(tmp: Path, number: int, value: float, paused: int | None = 3, lr: float = 0.01,
            state=TrialState.PRUNED):
    """A member's trial paused at ``paused`` with value ``value`` there and a checkpoint ``step=<paused>.ckpt``
    holding ``{"member": number}``."""
    directory = tmp / f"trial{number}"
    directory.mkdir(parents=True)
    (directory / f"step={paused or 8}.ckpt").write_text(json.dumps({"member": number}))
    user = {CHECKPOINT_DIR_ATTR: str(directory), **({PAUSED_ATTR: paused} if paused is not None else {})}
    return create_trial(state=state, value=value, params={"lr": lr, "layers": 2}, distributions=DISTS,
                        intermediate_values={0: 9.0, 3: value}, user_attrs=user)


def _study(trials) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", study_name="pbt-table")
    for t in trials:
        study.add_trial(t)
    return study


def test_the_bottom_member_clones_the_top_ones_checkpoint_with_its_params_and_mutates_the_learning_rate(tmp_path):
    """Four members paused at step 3 (values 0.1 0.2 0.3 0.4): the first three continue on their own in turn
    (oldest first, not bottom); the fourth, the bottom quarter, continues as a clone of a paused top-quarter member:
    that member's checkpoint copied over its own, that member's params with lr times 0.8 or 1.2, that member's
    curve, its own lineage (the budget counts it once), and the record of what it cloned."""
    study = _study([_member(tmp_path, 0, 0.4, lr=0.02), _member(tmp_path, 1, 0.1, lr=0.01),
                    _member(tmp_path, 2, 0.2), _member(tmp_path, 3, 0.3)])
    assert counted_trials(study) == 4
    queued = _pbt.continue_next(study, PBT)  # trial 0 is the oldest at the lowest step, and the bottom one
    clone = study.get_trials()[queued]
    assert clone.state == TrialState.WAITING and lineage(clone) == [0, queued]
    cloned = clone.user_attrs[PBT_CLONE_ATTR]
    assert (cloned["from_trial"], cloned["continues"], cloned["at_step"], cloned["donor_step"]) == (1, 0, 3, 3)
    assert clone.params["layers"] == 2 and clone.params["lr"] in (pytest.approx(0.008), pytest.approx(0.012))
    assert cloned["changed"] == {"lr": [0.01, clone.params["lr"]]}
    assert clone.intermediate_values == {0: 9.0, 3: 0.1}  # the cloned member's curve
    assert [p.name for p in (tmp_path / "trial0").iterdir()] == ["step=3.ckpt"]
    assert json.loads((tmp_path / "trial0" / "step=3.ckpt").read_text()) == {"member": 1}
    assert counted_trials(study) == 3  # the paused trial is continued; the clone counts once it runs


def test_a_member_above_the_bottom_continues_itself_and_nobody_clones_below_two_members(tmp_path):
    study = _study([_member(tmp_path, 0, 0.1), _member(tmp_path, 1, 0.2), _member(tmp_path, 2, 0.3),
                    _member(tmp_path, 3, 0.4)])
    queued = _pbt.continue_next(study, PBT)
    retry = study.get_trials()[queued]
    assert lineage(retry) == [0, queued] and PBT_CLONE_ATTR not in retry.user_attrs  # a plain re-queue
    assert json.loads((tmp_path / "trial0" / "step=3.ckpt").read_text()) == {"member": 0}
    lone = _study([_member(tmp_path / "lone", 0, 0.9)])
    assert _pbt.pick_donor(lone, PBT, lone.get_trials()[0], lone.get_trials(), [0]) is None


def test_only_a_paused_top_member_is_cloned_and_the_lowest_step_goes_first(tmp_path):
    """The top member is running its next interval (no stable checkpoint): the bottom one continues itself. A member
    paused at step 6 waits while one at step 3 is paused."""
    top_running = _member(tmp_path, 0, 0.1, paused=None, state=TrialState.RUNNING)
    study = _study([top_running, _member(tmp_path, 1, 0.2, paused=6), _member(tmp_path, 2, 0.3),
                    _member(tmp_path, 3, 0.4)])
    queued = _pbt.continue_next(study, PBT)
    assert lineage(study.get_trials()[queued]) == [2, queued]  # step 3 before step 6; trial 2 is not bottom
    queued = _pbt.continue_next(study, PBT)
    assert lineage(study.get_trials()[queued]) == [3, queued]
    assert PBT_CLONE_ATTR not in study.get_trials()[queued].user_attrs  # bottom, but the top is running


@pytest.mark.parametrize("dist, value", [
    (FloatDistribution(1e-4, 1e-1, log=True), 0.09), (FloatDistribution(0.0, 1.0, step=0.1), 0.5),
    (IntDistribution(1, 4), 4), (IntDistribution(1, 4), 1), (IntDistribution(2, 64, step=2), 8),
    (CategoricalDistribution(["a", "b", "c"]), "b"), (CategoricalDistribution([16, 32]), 32),
])
def test_explored_values_stay_in_their_distribution_and_ints_move(dist, value):
    rng = random.Random(0)
    for factor in (0.8, 1.2):
        new = _pbt.perturb(dist, value, factor)
        assert dist._contains(dist.to_internal_repr(new)), (new, dist)
        if isinstance(dist, IntDistribution) and dist.low < value < dist.high:
            assert new != value
    for _ in range(50):
        drawn = _pbt.draw(dist, rng)
        assert dist._contains(dist.to_internal_repr(drawn)), (drawn, dist)
    assert _pbt.perturb(FloatDistribution(1e-4, 1e-1, log=True), 0.09, 1.2) == 0.1  # clipped to the range


@pytest.mark.parametrize("dist, value, factor, expected", [
    (FloatDistribution(1e-4, 1e-2, log=True), 1e-4, 0.8, 1e-4 * 1.25),  # the HF PBT soak test's donor at the low end
    (FloatDistribution(1e-4, 1e-2, log=True), 1e-2, 1.2, 1e-2 / 1.2),
    (FloatDistribution(0.0, 1.0, step=0.1), 1.0, 1.2, 0.8),
    (IntDistribution(1, 4), 4, 1.2, 3),
    (IntDistribution(1, 4), 1, 0.8, 2),
    (CategoricalDistribution(["a", "b", "c"]), "c", 1.2, "b"),
    (CategoricalDistribution([16, 32]), 16, 0.8, 32),
])
def test_a_value_at_the_bound_the_factor_points_to_moves_the_other_way(dist, value, factor, expected):
    """A clone explores: where the clip would give the donor's value back, the perturbation goes the other way."""
    got = _pbt.perturb(dist, value, factor)
    assert got == (pytest.approx(expected) if isinstance(expected, float) else expected), got


BASE = {"sampler": {"_target_": "optuna.samplers.TPESampler"}, "pruner": {"_target_": "optuna.pruners.NopPruner"}}
GOOD = {"name": "pbt", "interval": 3, "max_steps": 9, "mutations": ["lr"]}


@pytest.mark.parametrize("change, words", [
    ({"scheduler": {**GOOD, "max_steps": None}}, "max_steps must be an integer above interval=3"),
    ({"scheduler": {**GOOD, "interval": 0}}, "interval must be an integer >= 1"),
    ({"scheduler": {**GOOD, "quantile": 0.6}}, r"quantile must be a number in \(0, 0.5\]"),
    ({"scheduler": {**GOOD, "resample_probability": 2}}, r"resample_probability must be a number in \[0, 1\]"),
    ({"scheduler": {**GOOD, "perturbation": []}}, "perturbation must be a non-empty list"),
    ({"scheduler": {**GOOD, "mutations": []}}, "mutations must be a non-empty list"),
    ({"scheduler": {**GOOD, "population": 1}}, "population must be null"),
    ({"scheduler": {**GOOD, "mutation": ["lr"]}}, r"Unknown hydra.sweeper.scheduler key\(s\) for hydra/sweeper/"
                                                 r"scheduler=pbt: 'mutation' \(did you mean 'mutations'\?\)"),
    ({"scheduler": {"name": "asha", "max_steps": 9, "interval": 3}}, "'interval'. Valid keys: name, min_steps"),
    ({"scheduler": GOOD, "pruner": {"_target_": "optuna.pruners.MedianPruner"}}, "Use hydra/sweeper/pruner=nop"),
    ({"scheduler": GOOD, "direction": ["minimize", "maximize"]}, "ranks one objective"),
])
def test_settings_that_pbt_refuses_before_anything_runs(change, words):
    with pytest.raises(SweeperConfigError, match=words):
        Settings.from_node({**BASE, **change}, world_size=1)


def test_population_replaces_n_trials_and_the_rungs_are_the_intervals():
    settings = Settings.from_node({**BASE, "n_trials": 20, "scheduler": {**GOOD, "population": 6}}, world_size=1)
    assert settings.n_trials == 6 and settings.scheduler.rungs == (3, 6)
    assert settings.scheduler.pause_step(None) == 3 and settings.scheduler.pause_step(6) is None


def test_a_resumed_hf_run_trains_with_its_own_learning_rate_at_the_schedules_step():
    """The Trainer loads the checkpoint's optimizer and scheduler (the saved run's 1e-3) before on_train_begin;
    :func:`apply_learning_rate` makes 4e-3 the peak, at the linear schedule's step 5 of 10 (half of it)."""
    from transformers import get_linear_schedule_with_warmup

    def run(lr):
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        return opt, get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=10)

    opt, sched = run(1e-3)
    for _ in range(5):
        opt.step()
        sched.step()
    saved = (opt.state_dict(), sched.state_dict())
    opt2, sched2 = run(4e-3)
    opt2.load_state_dict(saved[0])
    sched2.load_state_dict(saved[1])
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5e-3)  # the saved run's rate came back with the state
    assert apply_learning_rate(4e-3, opt2, sched2)
    assert opt2.param_groups[0]["lr"] == pytest.approx(2e-3) and sched2.get_last_lr() == [pytest.approx(2e-3)]
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(4e-3 * 4 / 10)
    assert not apply_learning_rate(4e-3, opt2, sched2)  # already its own rate: nothing to do


def _runs(tmp_path: Path) -> dict[int, dict]:
    lines = (tmp_path / "records" / "runs_rank0.jsonl").read_text().splitlines()
    return {r["trial"]: r for r in map(json.loads, lines)}


def test_a_pbt_sweep_clones_from_the_donors_checkpoint_and_every_member_reaches_the_end(tmp_path):
    """rung_app under PBT: 4 members, pauses at steps 3 and 6 of 9. A clone starts after the donor's pause step
    from the donor's checkpoint (its x), with the donor's x mutated; every member ends COMPLETE at step 8; the
    results hold the best member's schedule when it cloned; the budget counts members."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", "hydra.sweeper.sampler.seed=1",
            "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9}]"]
    out = run_app("rung_app", args, config_name="pbt", env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check().output
    study = optuna.load_study(study_name="rung_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    trials, runs = {t.number: t for t in study.get_trials()}, _runs(tmp_path)
    clones = [t for t in trials.values() if t.user_attrs.get(PBT_CLONE_ATTR)]
    assert clones, out[-3000:]
    for t in clones:
        cloned = t.user_attrs[PBT_CLONE_ATTR]
        donor = trials[cloned["from_trial"]]
        assert runs[t.number]["start"] == cloned["donor_step"] + 1 == donor.user_attrs[PAUSED_ATTR] + 1
        assert runs[t.number]["ckpt_x"] == donor.params["x"] == cloned["changed"]["x"][0]
        assert runs[t.number]["x"] == t.params["x"] == cloned["changed"]["x"][1]
    complete = [t for t in trials.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == 4 == counted_trials(study) and all(max(t.intermediate_values) == 8 for t in complete)
    assert "PBT: member of trial" in out


def test_a_sigterm_in_the_ask_of_a_members_next_interval_leaves_it_queued_for_the_same_command(tmp_path):
    """SIGTERM on rank 0 while it prepares the first interval that continues a member (a clone or the member going
    on): that trial never ran and is closed, and a copy of it goes back to the queue, so the same command runs it:
    four members, each COMPLETE at step 8, a clone still starting from its donor's checkpoint. Before, the closed
    interval marked its member as continued: the member was counted for nothing and never reached the end."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", "hydra.sweeper.sampler.seed=1",
            "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9}]",
            "hydra.sweeper.custom_search_space=search_space_fns.sigterm_at_the_first_continuation"]
    env = {"DSO_RECORD_DIR": str(tmp_path / "records")}
    run_app("rung_app", args, config_name="pbt", env=env).check(143)
    out = run_app("rung_app", args, config_name="pbt", env=env).check().output
    study = optuna.load_study(study_name="rung_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    trials, runs = {t.number: t for t in study.get_trials()}, _runs(tmp_path)
    assert [t.user_attrs.get(NEVER_RAN_ATTR) for t in trials.values()].count(True) == 1
    complete = [t for t in trials.values() if t.state == TrialState.COMPLETE]
    assert len(complete) == 4 == counted_trials(study) and all(max(t.intermediate_values) == 8 for t in complete)
    for t in (t for t in trials.values() if t.user_attrs.get(PBT_CLONE_ATTR) and t.number in runs):
        cloned = t.user_attrs[PBT_CLONE_ATTR]
        assert runs[t.number]["start"] == cloned["donor_step"] + 1
        assert runs[t.number]["ckpt_x"] == trials[cloned["from_trial"]].params["x"], out[-3000:]


def test_members_tied_with_the_bottom_all_clone_the_top_one(tmp_path):
    """Three members stuck at one value (chance accuracy) and one above: each of the three clones the top member,
    whatever their order (a new user's run: before, an order among equals let none of them clone once the others
    had continued)."""
    study = _study([_member(tmp_path, 0, 0.5), _member(tmp_path, 1, 0.5), _member(tmp_path, 2, 0.5),
                    _member(tmp_path, 3, 0.1)])
    clones = []
    for _ in range(4):
        queued = _pbt.continue_next(study, PBT)
        clones.append(study.get_trials()[queued].user_attrs.get(PBT_CLONE_ATTR))
    assert [c and c["from_trial"] for c in clones] == [3, 3, 3, None], clones  # the top member goes on itself


def test_a_failed_copy_lets_the_member_continue_from_its_own_checkpoint(tmp_path):
    """The donor's checkpoint is gone when the bottom member is to clone it (deleted by hand, a full disk): the
    member continues as itself, said in a warning, and the search does not stop."""
    study = _study([_member(tmp_path, 0, 0.4), _member(tmp_path, 1, 0.1), _member(tmp_path, 2, 0.2),
                    _member(tmp_path, 3, 0.3)])
    donor_dir = tmp_path / "trial1"
    original = _pbt.copy_checkpoint

    def copy_after_the_donor_lost_it(donor, member):
        for path in donor_dir.iterdir():
            path.unlink()
        return original(donor, member)

    _pbt.copy_checkpoint, restore = copy_after_the_donor_lost_it, _pbt.copy_checkpoint
    try:
        queued = _pbt.continue_next(study, PBT)
    finally:
        _pbt.copy_checkpoint = restore
    retry = study.get_trials()[queued]
    assert lineage(retry) == [0, queued] and PBT_CLONE_ATTR not in retry.user_attrs
    assert json.loads((tmp_path / "trial0" / "step=3.ckpt").read_text()) == {"member": 0}


def test_a_clone_of_a_warm_start_is_no_warm_start_run(tmp_path):
    """The bottom member was a warm start (``fixed_params`` and ``ds_optuna:enqueued``): its clone runs other params,
    so it carries neither mark (refit.trials=[enqueued] would take it for the warm start's run)."""
    from hydra_plugins.ds_optuna_sweeper._study._stored import ENQUEUED_ATTR, FIXED_PARAMS_ATTR

    warm = _member(tmp_path, 0, 0.4)
    warm.user_attrs[ENQUEUED_ATTR] = True
    warm.system_attrs[FIXED_PARAMS_ATTR] = {"lr": 0.01, "layers": 2}
    study = _study([warm, _member(tmp_path, 1, 0.1), _member(tmp_path, 2, 0.2), _member(tmp_path, 3, 0.3)])
    number = _pbt.continue_next(study, PBT)  # before get_trials(): the clone is a new trial
    clone = study.get_trials()[number]
    assert clone.user_attrs[PBT_CLONE_ATTR]["from_trial"] == 1
    assert ENQUEUED_ATTR not in clone.user_attrs and FIXED_PARAMS_ATTR not in clone.system_attrs


def test_the_refit_of_a_cloned_member_replays_its_schedule_part_by_part(tmp_path):
    """``refit.schedule`` (the default under PBT): the refit of a COMPLETE trial whose model came through a clone
    runs its schedule in parts, in ``refit/<trial>``: each part with its segment's params (x), resumed after the
    step the part before paused at, from that part's own checkpoint (its x in the checkpoint), pausing at its
    segment's end; the last runs to the end. ``refit.schedule=false`` runs the last params from step 0."""
    sweep = tmp_path / "sweep"
    env = {"DSO_RECORD_DIR": str(tmp_path / "records")}
    args = ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.plots=false", "hydra.sweeper.sampler.seed=1",
            "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9}]"]
    run_app("rung_app", args, config_name="pbt", env=env).check()
    study = optuna.load_study(study_name="rung_app", storage=f"sqlite:///{sweep}/optuna.db")
    trials = study.get_trials()
    replayed = [t for t in trials if t.state == TrialState.COMPLETE and len(_pbt.schedule(trials, t.number)) > 1]
    assert replayed, [(t.number, t.state.name, t.user_attrs.get(PBT_CLONE_ATTR)) for t in trials]
    number = replayed[0].number
    segments = _pbt.schedule(trials, number)
    assert [s["from_step"] for s in segments[1:]] == [s["to_step"] for s in segments[:-1]]
    assert segments[-1]["to_step"] is None and segments[0]["from_step"] is None and number in segments[-1]["trials"]
    for refit_args, parts in (([], len(segments)), (["hydra.sweeper.refit.schedule=false"], 1)):
        before = len((tmp_path / "records" / "runs_rank0.jsonl").read_text().splitlines())
        run_app("rung_app", [*args, "hydra.sweeper.refit.enabled=true", f"hydra.sweeper.refit.trials=[{number}]",
                             *refit_args], config_name="pbt", env=env).check()
        runs = [json.loads(line) for line in (tmp_path / "records" / "runs_rank0.jsonl").read_text().splitlines()]
        assert len(runs) - before == parts and {r["trial"] for r in runs[before:]} == {number}
        if parts == 1:
            assert runs[-1]["start"] == 0 and runs[-1]["x"] == segments[-1]["params"]["x"] and not runs[-1]["paused"]
            continue
        for k, (run, segment) in enumerate(zip(runs[before:], segments)):
            assert run["x"] == segment["params"]["x"], (k, run, segment)
            assert run["start"] == (0 if k == 0 else segment["from_step"] + 1), (k, run, segment)
            assert run["ckpt_x"] == (None if k == 0 else segments[k - 1]["params"]["x"]), (k, run)
            assert run["paused"] == (k < len(segments) - 1) and run["last"] == (segment["to_step"] or 8), (k, run)
        results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
        (entry,) = results["refit"]
        assert entry["state"] == "COMPLETE" and entry["part"] == f"part {parts} of {parts}"
        assert f"hydra.sweep.dir={sweep}" in entry["rerun_command"]  # the sweep's line: it reruns the refit
        assert [s["params"] for s in entry["schedule"]] == [s["params"] for s in segments]


class _Runs:
    """The refit's plan for :class:`RefitQueue`: two parts of trial 7's replay, then baseline ``b`` (-1)."""

    def __init__(self, directory: Path) -> None:
        self.driver = SimpleNamespace(settings=SimpleNamespace(refit_overrides=()), sweep_dir=str(directory))
        self.recorded: list[tuple[str, str]] = []
        parts = [TrialPayload(7, {"x": x}, [f"x={x}"], checkpoint_dir=str(directory), pause_at=pause,
                              part=f"part {k + 1} of 2") for k, (x, pause) in enumerate([(0.5, 3), (0.3, None)])]
        self._runs = [parts, [TrialPayload(-1, {}, [], baseline="b")]]

    def runs(self) -> list[list[TrialPayload]]:
        return self._runs

    def record(self, payload: TrialPayload, verdict: Verdict) -> None:
        self.recorded.append((payload.what, verdict.state.name))


def test_the_refit_queue_hands_out_a_replays_parts_in_order_to_whichever_group_asks(tmp_path):
    """With two trial groups: part 2 waits until part 1 paused (the other group gets the baseline meanwhile, then
    nothing), and resumes from part 1's checkpoint; a part that ends without pausing fails the refit and drops
    the parts after it."""
    runs = _Runs(tmp_path)
    queue = RefitQueue(runs)
    first = queue.next().payloads[0]
    assert (first.part, first.resume_from) == ("part 1 of 2", None)
    assert queue.next().payloads[0].baseline == "b"
    queue.record(TrialPayload(-1, baseline="b"), Verdict(-1, TrialState.COMPLETE, None))
    assert queue.next() is None  # the other group waits: part 2 needs part 1's checkpoint
    (tmp_path / "step=3.ckpt").write_text("{}")
    queue.record(first, Verdict(7, TrialState.PRUNED, None, paused_at=3))
    second = queue.next().payloads[0]
    assert (second.what, second.resume_from, second.pause_at) == ("trial 7 (part 2 of 2)", str(tmp_path / "step=3.ckpt"), None)
    queue.record(second, Verdict(7, TrialState.COMPLETE, (0.1,)))
    assert queue.next().reason == "refit done" and runs.recorded == [("baseline b", "COMPLETE"),
                                                                       ("trial 7 (part 2 of 2)", "COMPLETE")]
    runs = _Runs(tmp_path)
    queue = RefitQueue(runs)
    first = queue.next().payloads[0]
    queue.record(first, Verdict(7, TrialState.COMPLETE, (0.2,)))  # ran to its end: never asked should_preempt()
    assert queue.next().payloads[0].baseline == "b"
    queue.record(TrialPayload(-1, baseline="b"), Verdict(-1, TrialState.COMPLETE, None))
    stop = queue.next()
    assert "part 1 of 2 of the replayed schedule ended COMPLETE instead of pausing at step 3" in str(stop.error)


@pytest.mark.parametrize("override, words", [
    ("hydra.sweeper.scheduler.intervall=2", "'intervall' (did you mean 'interval'?)"),
    ("hydra.sweeper.scheduler.mutation=[x]", "'mutation' (did you mean 'mutations'?)"),
])
def test_a_mistyped_scheduler_key_without_plus_is_named_with_the_valid_one(tmp_path, override, words):
    """Without Hydra's '+' (its struct error advised adding one; found by a new user): the sweeper's own message."""
    res = run_app("rung_app", ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", override], config_name="pbt")
    assert res.returncode == 1 and words in res.output and "append to your config" not in res.output, res.output
    assert not (tmp_path / "sweep" / "optuna.db").exists()


def test_the_draws_follow_the_samplers_seed_else_a_random_one_kept_by_the_study():
    """PBT's random draws (donor, perturbation, resampling) are seeded by the sampler's seed when it has one, else by
    a random seed; either is stored on the study, so a resume draws on from it (a new user found two unseeded
    sweeps drawing the same values: the draws followed the study's name)."""
    seeded = _study([])
    assert _pbt.study_seed(seeded, 7) == 7 == seeded.user_attrs["ds_optuna:pbt_seed"]
    assert _pbt.study_seed(seeded, 8) == 7  # a resume keeps the stored seed
    unseeded = [optuna.create_study(study_name="same-name") for _ in range(2)]
    first, second = (_pbt.study_seed(s, None) for s in unseeded)
    assert first != second and _pbt.study_seed(unseeded[0], None) == first
