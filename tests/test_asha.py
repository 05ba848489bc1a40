"""Promotion ASHA (issue 41, ``hydra/sweeper/scheduler=asha``): the paper's promotion rule as a table over real
in-memory Optuna studies, the settings it refuses, and in-process sweeps of ``tests/apps/rung_app.py`` (world size
1: what rank 0 decides is the same code at any world size; the 2-rank run is ``tests/multirank/test_schedulers.py``).
"""

from __future__ import annotations

import atexit
import csv
import itertools
import json
import shutil
import tempfile
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._scheduler_settings import Scheduler
from hydra_plugins.ds_optuna_sweeper._settings import Settings
from hydra_plugins.ds_optuna_sweeper._study import _asha
from hydra_plugins.ds_optuna_sweeper._study._queue import counted_trials, lineage
from hydra_plugins.ds_optuna_sweeper._study._stored import CHECKPOINT_DIR_ATTR, NEVER_RAN_ATTR, PAUSED_ATTR
from tests.in_process import run_app

ASHA = Scheduler("asha", min_steps=1, max_steps=9, reduction_factor=3)  # rungs at steps 1 and 3
P, C, R, F = TrialState.PRUNED, TrialState.COMPLETE, TrialState.RUNNING, TrialState.FAIL


#: Checkpoint directories of the table's trials (each holds a ``step=<n>.ckpt``), removed at exit.
CKPT = Path(tempfile.mkdtemp(prefix="dso-asha-"))
atexit.register(shutil.rmtree, CKPT, True)
_dirs = itertools.count()


def _trial(curve: dict[int, float], state=P, paused: int | None = None, continues: list[int] | None = None,
           checkpoint: bool = True):
    """A stored trial: its intermediate values, its state, the rung it paused at, the trials it continues, and a
    checkpoint directory holding a checkpoint of its last step (``checkpoint=False``: an empty one)."""
    attrs = {"failed_trial": continues[0], "retry_history": continues} if continues else {}
    directory = CKPT / f"d{next(_dirs)}"
    directory.mkdir()
    if checkpoint:
        (directory / f"step={max(curve)}.ckpt").write_text("{}")
    user = {CHECKPOINT_DIR_ATTR: str(directory), **({PAUSED_ATTR: paused} if paused is not None else {})}
    return create_trial(state=state, value=None if state in (R, F) else list(curve.values())[-1],
                        params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                        intermediate_values=curve, user_attrs=user, system_attrs=attrs)


def _study(trials, direction="minimize") -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=direction)
    for t in trials:
        study.add_trial(t)
    return study


def _paused(v0: float, v1: float | None = None) -> object:
    """Paused at rung 1 after steps 0 and 1 (value ``v0`` at step 1); with ``v1``, at rung 3 after steps 2, 3."""
    if v1 is None:
        return _trial({0: 9.0, 1: v0}, paused=1)
    return _trial({0: 9.0, 1: v0, 2: 9.0, 3: v1}, paused=3)


# (trials in number order, direction, the trial the paper's rule promotes). Rung 1: the top floor(n/3) of the n
# configurations with a value at step >= 1; rung 3 the same, looked at first.
CASES = [
    pytest.param([_paused(0.5), _paused(0.7)], "minimize", None, id="two-at-rung-1-none-in-the-top-third"),
    pytest.param([_paused(0.5), _paused(0.7), _paused(0.6)], "minimize", 0, id="three-the-best-is-promoted"),
    pytest.param([_paused(0.5), _paused(0.7), _paused(0.6)], "maximize", 1, id="maximize-the-largest"),
    pytest.param([_paused(0.5), _paused(0.7), _paused(0.6),
                  _trial({0: 9.0, 1: 0.5, 2: 9.0}, state=R, continues=[0])], "minimize", None,
                 id="the-best-is-running-its-continuation-none-other-in-the-top"),
    pytest.param([_paused(0.5), _paused(0.4), _paused(0.6), _paused(0.3), _paused(0.8), _paused(0.9)], "minimize", 3,
                 id="six-top-two-best-first"),
    pytest.param([_paused(0.5), _paused(0.4), _paused(0.6), _paused(0.3), _paused(0.8), _paused(0.9),
                  _trial({0: 9.0, 1: 0.3, 2: 9.0, 3: 0.2}, paused=3, continues=[3])], "minimize", 1,
                 id="top-two-once-the-first-continued-to-the-second-best"),
    pytest.param([_paused(0.5, 0.10), _paused(0.4, 0.2), _paused(0.6, 0.3), _paused(0.7)], "minimize", 0,
                 id="the-highest-rung-first"),
    pytest.param([_paused(float("nan")), _paused(0.7), _paused(0.6)], "minimize", 2, id="nan-ranks-last"),
    pytest.param([_paused(float("nan")), _paused(0.7), _paused(0.6)], "maximize", 1, id="nan-ranks-last-maximize"),
    pytest.param([_trial({0: 9.0, 1: 0.1, 2: 0.1}, state=C), _paused(0.7), _paused(0.6)], "minimize", None,
                 id="a-completed-trial-holds-the-top-third"),
    pytest.param([_paused(0.5), _paused(0.7), _paused(0.6), _trial({0: 9.0, 1: 0.5, 2: 0.4}, state=F, continues=[0])],
                 "minimize", 0, id="its-continuation-failed-once-Ctrl-C-promoted-again"),
    pytest.param([_paused(0.5), _paused(0.7), _paused(0.6), _trial({0: 9.0, 1: 0.5, 2: 0.4}, state=F, continues=[0]),
                  _trial({0: 9.0, 1: 0.5, 2: 0.4}, state=F, continues=[0])], "minimize", None,
                 id="its-continuation-failed-twice-it-stays"),
]


@pytest.mark.parametrize("trials, direction, promoted", CASES)
def test_the_promotion_follows_the_papers_rule(trials, direction, promoted):
    assert _asha.promotion(_study(trials, direction), ASHA) == promoted


@pytest.mark.parametrize("trials, promoted", [
    pytest.param([_paused(0.5), _paused(0.7)], 0, id="two-at-rung-1-the-best-goes-on"),
    pytest.param([_paused(0.5, 0.3), _paused(0.7)], 0, id="one-at-rung-3-it-goes-on-first"),
    pytest.param([_trial({0: 9.0, 1: 0.5, 2: 9.0, 3: 0.3, 4: 0.2}, state=C), _paused(0.7), _paused(0.6),
                  _paused(0.8)], 2, id="the-top-rounded-up-two-of-four"),
])
def test_with_the_budget_spent_each_rung_promotes_at_least_its_best(trials, promoted):
    """``finishing``: no new configuration comes; the top of n is ceil(n / 3), so the search ends with a trial
    that ran every step rather than with every configuration paused."""
    assert _asha.promotion(_study(trials), ASHA, finishing=True) == promoted


def test_a_tie_keeps_the_older_configuration_first_after_it_continued():
    """Three configurations tied at rung 1 (eta 3: the top one is promoted): configuration 0 was promoted and its
    continuation runs; configuration 1, tied with it, is not promoted as well (before, the continuation's higher
    number moved configuration 0 behind the tie, a new user's run at chance accuracy)."""
    trials = [_paused(0.5), _paused(0.5), _paused(0.5), _trial({0: 9.0, 1: 0.5, 2: 9.0}, state=R, continues=[0])]
    assert _asha.promotion(_study(trials), ASHA) is None


def test_a_paused_trial_without_a_checkpoint_is_never_promoted():
    """Its continuation would train from step 0 (its checkpoint was dropped by keep_paused, or never saved)."""
    trials = [_trial({0: 9.0, 1: 0.5}, paused=1, checkpoint=False), _paused(0.7), _paused(0.6), _paused(0.65),
              _paused(0.8), _paused(0.9)]
    assert _asha.promotion(_study(trials), ASHA) == 2


def test_keep_paused_drops_the_lowest_rungs_worst_checkpoints_first():
    """Paused at rung 3: trial 0; at rung 1: trials 1 (0.7), 2 (0.6), 3 (0.9). The two least
    likely to be promoted go with keep_paused=1: rung 1's worst (3), then its next worst (1); a promoted (continued) trial and a
    completed one are not paused trials."""
    trials = [_paused(0.5, 0.3), _paused(0.7), _paused(0.6), _paused(0.9),
              _trial({0: 9.0, 1: 0.5, 2: 0.4}, state=C, continues=[2])]
    study = _study(trials)
    dirs = {t.number: t.user_attrs[CHECKPOINT_DIR_ATTR] for t in study.get_trials()}
    assert _asha.over_cap(study, ASHA) == []  # no cap
    cap = Scheduler("asha", 1, 9, 3, keep_paused=1)
    assert _asha.over_cap(study, cap) == [dirs[3], dirs[1]]
    assert _asha.drop_over_cap(study, cap) == [dirs[3], dirs[1]]
    assert not Path(dirs[3]).exists() and Path(dirs[0]).exists() and _asha.over_cap(study, cap) == []


def test_keep_paused_bytes_drops_in_the_same_order_until_the_rest_fits():
    """The same paused trials (0, 1, 3 hold a 2-byte checkpoint each; 2 was promoted): a cap of 5 bytes drops the
    least likely to be promoted (3) and keeps 4 bytes; a cap of 1 byte drops all three, a cap of 6 none."""
    study = _study([_paused(0.5, 0.3), _paused(0.7), _paused(0.6), _paused(0.9),
                    _trial({0: 9.0, 1: 0.5, 2: 0.4}, state=C, continues=[2])])
    dirs = {t.number: t.user_attrs[CHECKPOINT_DIR_ATTR] for t in study.get_trials()}
    assert _asha.over_cap(study, Scheduler("asha", 1, 9, 3, keep_paused_bytes=5)) == [dirs[3]]
    assert _asha.over_cap(study, Scheduler("asha", 1, 9, 3, keep_paused_bytes=1)) == [dirs[3], dirs[1], dirs[0]]
    assert _asha.over_cap(study, Scheduler("asha", 1, 9, 3, keep_paused_bytes=6)) == []
    assert _asha.over_cap(study, Scheduler("asha", 1, 9, 3, keep_paused=2, keep_paused_bytes=6)) == [dirs[3]]


@pytest.mark.parametrize("given, size", [(None, None), (0, 0), (123, 123), ("20G", 20 * 1024**3), ("512MiB", 512 << 20),
                                         ("1.5k", 1536), (" 7 B ", 7)])
def test_sizes_in_bytes_or_with_a_unit(given, size):
    settings = Settings.from_node({**BASE, "scheduler": {**GOOD, "keep_paused_bytes": given}}, world_size=1)
    assert settings.scheduler.keep_paused_bytes == size


def test_the_continuation_of_a_promoted_trial_replaces_it_in_the_budget():
    """n_trials counts configurations: a promoted trial and the trial that continues it count once."""
    study = _study([_paused(0.5), _paused(0.7), _paused(0.6)])
    assert counted_trials(study) == 3
    study.add_trial(_trial({0: 9.0, 1: 0.5, 2: 0.4, 3: 0.3}, state=C, continues=[0]))
    assert counted_trials(study) == 3


def test_the_rungs_and_where_a_trial_pauses():
    assert ASHA.rungs == (1, 3)
    assert [ASHA.pause_step(s) for s in (None, 0, 1, 2, 3, 8)] == [1, 1, 3, 3, None, None]
    assert Scheduler("asha", 2, 50, 2).rungs == (2, 4, 8, 16, 32)
    assert Scheduler().rungs == () and Scheduler().pause_step(None) is None


BASE = {"sampler": {"_target_": "optuna.samplers.TPESampler"}, "pruner": {"_target_": "optuna.pruners.NopPruner"}}
GOOD = {"name": "asha", "min_steps": 1, "max_steps": 9, "reduction_factor": 3}


@pytest.mark.parametrize("change, words", [
    ({"scheduler": {**GOOD, "max_steps": None}}, "max_steps must be an integer above min_steps=1"),
    ({"scheduler": {**GOOD, "max_steps": 1}}, "max_steps must be an integer above min_steps=1"),
    ({"scheduler": {**GOOD, "min_steps": 0}}, "min_steps must be an integer >= 1"),
    ({"scheduler": {**GOOD, "reduction_factor": 1}}, "reduction_factor must be an integer >= 2"),
    ({"scheduler": {**GOOD, "reduction_factor": 2.5}}, "reduction_factor must be an integer >= 2"),
    ({"scheduler": {**GOOD, "keep_paused": -1}}, "keep_paused must be null"),
    ({"scheduler": {**GOOD, "keep_paused_bytes": "20 gigs"}}, "keep_paused_bytes must be null, a number of bytes"),
    ({"scheduler": {**GOOD, "keep_paused_bytes": -5}}, "keep_paused_bytes must be null, a number of bytes"),
    ({"scheduler": GOOD, "pruner": {"_target_": "optuna.pruners.MedianPruner"}}, "Use hydra/sweeper/pruner=nop"),
    ({"scheduler": GOOD, "direction": ["minimize", "maximize"]}, "ranks one objective"),
    ({"scheduler": GOOD, "repeats": 2, "seed_key": "seed"}, "Use repeats=1 with it"),
])
def test_settings_that_asha_refuses_before_anything_runs(change, words):
    with pytest.raises(SweeperConfigError, match=words):
        Settings.from_node({**BASE, **change}, world_size=1)


def _runs(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "records" / "runs_rank0.jsonl").read_text().splitlines()]


def _sweep(tmp_path: Path, *overrides: str):
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", *overrides]
    return run_app("rung_app", args, config_name="rung", env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()


def _load(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="rung_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")


def test_a_promoted_trial_resumes_where_it_paused_and_the_budget_counts_configurations(tmp_path):
    """rung_app (9 steps, rungs at steps 1 and 3, eta 3), 6 configurations: each continuation starts at the step
    after the one its trial paused at (never at 0), with the curve it inherited; a configuration that reaches the
    end has run every step once; the study holds 6 configurations."""
    out = _sweep(tmp_path, "hydra.sweeper.sampler.seed=0").output
    study, runs = _load(tmp_path), {r["trial"]: r for r in _runs(tmp_path)}
    trials = {t.number: t for t in study.get_trials()}
    continued = [t for t in trials.values() if t.system_attrs.get("retry_history")]
    assert continued, out[-3000:]
    for t in continued:
        parent = t.system_attrs["retry_history"][-1]
        assert runs[t.number]["start"] == runs[parent]["last"] + 1 > 0, (t.number, parent, runs)
        assert trials[parent].state == TrialState.PRUNED and trials[parent].user_attrs[PAUSED_ATTR] in ASHA.rungs
        assert set(trials[parent].intermediate_values) <= set(t.intermediate_values)  # the curve is kept
    complete = [t for t in trials.values() if t.state == TrialState.COMPLETE]
    assert complete  # with the budget spent, the best paused trials go on to the end
    for t in complete:
        assert sorted(t.intermediate_values) == list(range(9)), t.intermediate_values
    roots = {(t.system_attrs.get("retry_history") or [t.number])[0] for t in trials.values()}
    assert len(roots) == counted_trials(study) == 6
    assert "PROMOTED" in out and "PAUSED" in out
    with open(tmp_path / "sweep" / "trials.csv", newline="") as f:  # the chains, readable from the file
        rows = {int(r["number"]): r for r in csv.DictReader(f)}
    for t in continued:
        parent = t.system_attrs["retry_history"][-1]
        assert rows[t.number]["continues"] == str(parent) and rows[parent]["sweeper_state"] == "PROMOTED"
        assert rows[parent]["state"] == "PRUNED"  # Optuna's own column stays as Optuna stores it


def test_paused_trials_are_promoted_by_a_later_launch_and_samplers_see_them_as_pruned(tmp_path):
    """A launch that ends with its trials paused (here a stop rule ends it after two; SIGTERM or a crash leave the
    same study), then the same study again: the next launch promotes what the first paused (read from the study).
    x=0.3 is the best point, x=0.9 the worst: the third configuration makes x=0.3 the top third of rung 1. What
    samplers see of a paused trial: PRUNED with its intermediate values, its rung's value the last (TPE ranks
    pruned trials by their last step and value)."""
    warm = "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9}]"
    _sweep(tmp_path, warm, "hydra.sweeper.n_trials=3", "hydra.sweeper.stop.patience=2")
    first = {t.number: t for t in _load(tmp_path).get_trials()}
    assert [t.user_attrs.get(PAUSED_ATTR) for t in first.values()] == [1, 1]
    for t in first.values():
        assert t.state == TrialState.PRUNED and t.value == t.intermediate_values[1] == (t.params["x"] - 0.3) ** 2 + 0.5
    _sweep(tmp_path, warm, "hydra.sweeper.n_trials=3")
    later = [t for t in _load(tmp_path).get_trials() if t.number not in first]
    assert [t.system_attrs.get("retry_history") for t in later][:2] == [None, [0]], later
    assert [r["start"] for r in _runs(tmp_path)][:4] == [0, 0, 0, 2]


def test_a_sigterm_in_the_ask_of_a_promoted_trial_leaves_its_configuration_owed_to_the_next_launch(tmp_path):
    """SIGTERM on rank 0 while it prepares the continuation of the trial ASHA promotes (after Optuna's ask, before
    its payload leaves): the continuation is closed never-ran and put back in the queue, so the same command
    continues that configuration instead of sampling another. Before, the never-ran continuation still marked its
    paused trial as continued: the configuration counted for nothing, the next launch sampled a fourth, and the
    promoted point never ran to the end (CI's soak run of the SIGTERM-while-paused test, which hits the same window
    by chance)."""
    warm = "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9}]"
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", warm,
            "hydra.sweeper.n_trials=3", "hydra.sweeper.custom_search_space=search_space_fns.sigterm_at_the_first_continuation"]
    env = {"DSO_RECORD_DIR": str(tmp_path / "records")}
    run_app("rung_app", args, config_name="rung", env=env).check(143)
    trials = _load(tmp_path).get_trials()
    never_ran = [t for t in trials if t.user_attrs.get(NEVER_RAN_ATTR)]
    assert len(never_ran) == 1 and never_ran[0].state == TrialState.FAIL, trials
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert [lineage(t)[:-1] for t in waiting] == [lineage(never_ran[0])[:-1]], trials  # it continues the paused one
    assert NEVER_RAN_ATTR not in waiting[0].user_attrs  # the copy may run
    run_app("rung_app", args, config_name="rung", env=env).check()
    study = _load(tmp_path)
    trials = study.get_trials()
    assert TrialState.RUNNING not in {t.state for t in trials}
    assert len({(t.system_attrs.get("retry_history") or [t.number])[0] for t in trials}) == counted_trials(study) == 3
    best = [t for t in trials if t.state == TrialState.COMPLETE and t.params["x"] == 0.3]
    assert best and sorted(best[0].intermediate_values) == list(range(9)), trials
    runs = {r["trial"]: r for r in _runs(tmp_path)}
    assert runs[waiting[0].number]["start"] == runs[lineage(waiting[0])[-2]]["last"] + 1 > 0  # from its checkpoint
    assert never_ran[0].number not in runs


def test_a_sigterm_that_lands_at_a_rung_pauses_the_trial_there_and_the_next_launch_decides_its_promotion(tmp_path):
    """SIGTERM at the very step where a trial reaches its rung (rank 0 reports step 1, the first rung, then gets
    SIGTERM before its should_preempt()): the trial pauses at that rung with its checkpoint (PRUNED, kept), the
    launch still exits 143, and the next launch promotes it or not by the paper's rule. Before, the signal won: the
    trial was re-queued as preempted and its retry, resumed after step 1, ran to the end without ASHA's decision
    at that rung (a newcomer's run: a promoted continuation SIGTERMed at its rung ran straight to COMPLETE)."""
    warm = "hydra.sweeper.enqueue_trials=[{x:0.9},{x:0.3},{x:0.5}]"
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", warm, "hydra.sweeper.n_trials=3"]
    env = {"DSO_RECORD_DIR": str(tmp_path / "records")}
    out = run_app("rung_app", [*args, "sigterm_at_step=1"], config_name="rung", env=env).check(143).output
    first = [t for t in _load(tmp_path).get_trials() if t.state != TrialState.WAITING]  # the other warm starts wait
    assert [(t.state, t.user_attrs.get(PAUSED_ATTR)) for t in first] == [(TrialState.PRUNED, 1)], first
    assert "trial(s) [0] reached the step they pause at and were kept there with their checkpoint" in out, out[-3000:]
    run_app("rung_app", args, config_name="rung", env=env).check()
    study = _load(tmp_path)
    trials = study.get_trials()
    assert counted_trials(study) == 3 and TrialState.RUNNING not in {t.state for t in trials}
    worst = [t for t in trials if t.number > 0 and lineage(t)[0] == 0]  # x=0.9: the worst of the three at rung 1
    assert worst == [], worst  # never promoted past the rung it paused at when the signal came
    best = [t for t in trials if t.state == TrialState.COMPLETE and t.params["x"] == 0.3]
    assert best and sorted(best[0].intermediate_values) == list(range(9)), trials


def test_a_pause_without_a_checkpoint_the_sweeper_recognises_is_said_and_never_promoted(tmp_path):
    """A new user's ``model-step3.pt``: the trial pauses, but nothing can continue it; the pause says so (before,
    the sweep ended with every configuration PAUSED and no word)."""
    out = _sweep(tmp_path, "ckpt_name='model-step{step}.pt'", "hydra.sweeper.n_trials=3").output
    assert "paused at its rung (step 1), but " in out and "holds no checkpoint the sweeper recognises" in out
    assert {t.state for t in _load(tmp_path).get_trials()} == {TrialState.PRUNED}
    assert all(r["start"] == 0 for r in _runs(tmp_path))


def test_a_task_that_never_asks_should_preempt_runs_on_and_is_told_so_once(tmp_path):
    """ASHA pauses only a task that checks ``should_preempt()`` after its reports: ``sweep_app`` with ``steps``
    reports and asks ``should_prune()`` only, so its trials run to their end (COMPLETE), and rank 0 says why once."""
    from tests.in_process import sweep

    out = sweep(tmp_path, "hydra/sweeper/scheduler=asha", "hydra.sweeper.scheduler.max_steps=4", "steps=4",
                "hydra.sweeper.n_trials=2").check().output
    assert out.count("did not call trial.should_preempt() after that report") == 1, out[-3000:]
    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.COMPLETE]


def test_a_failed_continuation_keeps_the_paused_trials_checkpoint():
    """Ctrl-C during a promoted trial's continuation (FAIL): the retention rule used to delete the lineage's
    directory, the paused trial's checkpoint with it, and the configuration was lost for good."""
    from hydra_plugins.ds_optuna_sweeper._study._stored import CONTINUES_ATTR
    from hydra_plugins.ds_optuna_sweeper._study._trial_checkpoints import retain

    study = _study([_paused(0.5)])
    directory = study.trials[0].user_attrs[CHECKPOINT_DIR_ATTR]
    study.add_trial(create_trial(state=F, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                                 intermediate_values={0: 9.0, 1: 0.5, 2: 0.4},
                                 user_attrs={CHECKPOINT_DIR_ATTR: directory, CONTINUES_ATTR: 0},
                                 system_attrs={"failed_trial": 0, "retry_history": [0]}))
    assert retain(study, 1, keep_best=1, keep_pruned=False, retried=False) == []
    assert list(Path(directory).iterdir())


def test_re_queueing_a_continuation_leaves_its_own_retry_history_alone():
    """Optuna's retry callback appends to the list of the trial it copies; on a cached trial that is itself a
    continuation the process then saw it continue itself, and ASHA's budget miscounted (the configuration's failed
    continuation counted again; a SIGTERM test found it)."""
    from hydra_plugins.ds_optuna_sweeper._study._abandon import requeue_interrupted

    study = _study([_paused(0.5), _trial({0: 9.0, 1: 0.5, 2: 9.0, 3: 0.3}, paused=3, continues=[0])])
    assert requeue_interrupted(study, 1) == 2
    assert [t.system_attrs.get("retry_history") for t in study.get_trials(deepcopy=False)] == [None, [0], [0, 1]]


def test_tracking_keeps_one_run_per_configuration_across_its_pauses(tmp_path):
    """MLflow under ASHA: a configuration paused and promoted (twice, to the end) writes one run, named after its
    newest trial, tagged with its first trial, holding its whole curve; before, the second continuation opened a
    second run (it looked up the run of the trial it directly continued, not of the lineage's first)."""
    from tests.tracking_readers import mlflow_history, mlflow_runs

    _sweep(tmp_path, "hydra.sweeper.tracking.report_to=[mlflow]", "hydra.sweeper.n_trials=4",
           "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9},{x:0.5}]")
    study, uri = _load(tmp_path), f"sqlite:///{tmp_path / 'sweep'}/mlflow.db"
    runs = [r for r in mlflow_runs(uri, "rung_app") if r.data.tags.get("ds_optuna.kind") != "study"]
    trials = study.get_trials()
    firsts = sorted({(t.system_attrs.get("retry_history") or [t.number])[0] for t in trials})
    assert sorted(int(r.data.tags["ds_optuna.trial"]) for r in runs) == firsts  # one run per configuration
    done = next(t for t in trials if t.state == TrialState.COMPLETE)
    run = next(r for r in runs if r.info.run_name == f"trial-{done.number} (resumes trial-0)")
    assert done.system_attrs["retry_history"][0] == 0 and len(done.system_attrs["retry_history"]) == 2
    assert mlflow_history(uri, run.info.run_id, "intermediate_value") == pytest.approx(done.intermediate_values)


def test_reports_past_max_steps_say_once_that_the_rungs_are_in_another_unit(tmp_path):
    """A new user's rungs in optimizer steps (min_steps=8 max_steps=32) while the HF glue reported thousandths of
    an epoch: every trial paused at its first report and the search ran on silently. rung_app reports steps 0-8;
    with max_steps=4 the sweep says once that trial reports went past it, and names the unit."""
    out = _sweep(tmp_path, "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_trials=4",
                 "hydra.sweeper.scheduler.max_steps=4").output
    assert out.count("past hydra.sweeper.scheduler.max_steps=4") == 1, out[-3000:]
    assert "in the unit of the task's trial.report(value, step)" in out
    out = _sweep(tmp_path / "again", "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_trials=4").output
    assert "past hydra.sweeper.scheduler.max_steps" not in out  # max_steps=9: the app's last step is 8
