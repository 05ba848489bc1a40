"""Warm starts on a grid (case C32) and a failed warm start (case C36), issue 21.

C32: on ``hydra/sweeper/sampler=grid`` a warm start counts as its grid point, so each point runs once
(Optuna's ``GridSampler`` gives an enqueued trial no grid point: 0.1, 0.2, 0.2, 0.1 ran, 0.3 and 0.4
never did, optuna/optuna PR#2946, #3256); a warm start that is no grid point is refused before trial 0.
C36: a warm start whose every run failed is queued again on the next run of the same command, a
COMPLETE or PRUNED one is not, a WAITING one is not queued twice, one log line per warm start says
which; ``refit.trials: [enqueued]`` refits each warm start's last COMPLETE run (transformers PR#12831).

The tests use real Optuna studies (SQLite in ``tmp_path``); the sweeps run the real command line
(``tests/apps/warm_start_app.py``) in process at world size 1 (``tests/in_process.py``): which warm start is
queued, which grid point runs and what is refit is rank 0's decision alone. That every rank runs rank 0's
params is the same-params contract's (``tests/multirank/test_sweep.py``, C01); that a refit runs on every
rank, the refit launch's (``tests/multirank/test_refit.py``).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study import _grid, _queue
from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space
from tests.in_process import run_app

GRID_X = "x=choice(0.1,0.2,0.3,0.4)"


# --- in process: the sampler and the queue ------------------------------------------------------


def _ask_tell_until_done(study: optuna.Study, space, rounds: int, batch: int = 1, state=TrialState.COMPLETE) -> list[dict]:
    """Ask and tell as the driver does: rounds of up to ``batch`` asks (``n_jobs``) with
    ``ask(fixed_distributions=...)``, capped by the grid's points left, stopping when the grid is done."""
    ran = []
    for _ in range(rounds):
        left = _grid.points_left(study)
        if left == 0 and study.sampler.is_exhausted(study):
            break
        trials = [study.ask(fixed_distributions=space.distributions()) for _ in range(min(batch, max(left or 1, 1)))]
        for trial in trials:
            try:
                study.tell(trial, 1.0 if state == TrialState.COMPLETE else None, state=state)
            except RuntimeError:  # GridSampler's study.stop() outside optimize: the grid is done
                pass
            ran.append(dict(trial.params))
    return ran


@pytest.mark.parametrize("seed", [None, 0, 1, 7, 12345])
def test_c32_warm_starts_count_as_their_grid_points(tmp_path, seed):
    """The case's input, through the sampler the sweeper builds: exactly 0.1, 0.2, 0.3, 0.4 ran, once
    each, warm starts first; a bigger budget stops at the grid's end."""
    space = build_search_space({}, [GRID_X])
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/db.sqlite",
                                sampler=_grid.WarmStartGridSampler(space.grid(), seed=seed))
    _queue.enqueue_warm_starts(study, ({"x": 0.1}, {"x": 0.2}), space, grid=space.grid())
    ran = _ask_tell_until_done(study, space, rounds=10)
    assert [p["x"] for p in ran[:2]] == [0.1, 0.2]
    assert sorted(p["x"] for p in ran) == [0.1, 0.2, 0.3, 0.4]


def test_c32_no_grid_point_repeats_over_resumes_with_warm_starts(tmp_path):
    """The same kind of fault over a 24-point grid of three params (float choice, int range, str
    choice): 40 studies, each resumed 4 times with random warm starts (grid points, some already run)
    random budgets and rounds of 1 to 4 asks (``n_jobs``); no point ever runs twice, and a study asked
    enough runs every point."""
    space = build_search_space({}, ["x=choice(0.1,0.2,0.3,0.4)", "y=range(1,4)", "z=choice(a,b)"])
    grid = space.grid()
    points = list(itertools.product(*grid.values()))
    for case in range(40):
        rng = random.Random(case)
        study = optuna.create_study(sampler=_grid.WarmStartGridSampler(grid, seed=rng.choice([None, case])))
        ran: list[tuple] = []
        for _ in range(4):
            warm = tuple(dict(zip(grid, p)) for p in rng.sample(points, rng.randint(0, 5)))
            _queue.enqueue_warm_starts(study, warm, space, grid=grid)
            ran += [tuple(p[k] for k in grid)
                    for p in _ask_tell_until_done(study, space, rng.randint(1, 6), batch=rng.randint(1, 4))]
        ran += [tuple(p[k] for k in grid) for p in _ask_tell_until_done(study, space, 30)]
        assert sorted(ran) == sorted(points), f"case {case}: repeats {[p for p in set(ran) if ran.count(p) > 1]}"


def test_c32_c36_a_failed_warm_start_runs_again_on_a_finished_grid(tmp_path):
    """Every grid point ran, the warm start 0.1 failed: the same command queues 0.1 again and runs only
    it; the run after that runs nothing (the grid is done)."""
    space = build_search_space({}, [GRID_X])
    grid = space.grid()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/db.sqlite", sampler=_grid.WarmStartGridSampler(grid))
    _queue.enqueue_warm_starts(study, ({"x": 0.1},), space, grid=grid)
    assert _ask_tell_until_done(study, space, rounds=1, state=TrialState.FAIL) == [{"x": 0.1}]
    assert sorted(p["x"] for p in _ask_tell_until_done(study, space, rounds=10)) == [0.2, 0.3, 0.4]
    _queue.enqueue_warm_starts(study, ({"x": 0.1},), space, grid=grid)
    assert _grid.points_left(study) == 1
    assert _ask_tell_until_done(study, space, rounds=10) == [{"x": 0.1}]
    _queue.enqueue_warm_starts(study, ({"x": 0.1},), space, grid=grid)
    assert _ask_tell_until_done(study, space, rounds=10) == [] and len(study.trials) == 5


def test_c32_a_float_range_grid_takes_the_grid_value_and_partial_or_off_grid_warm_starts_are_refused():
    space = build_search_space({}, ["x=range(0.1,0.5,0.1)", "y=choice(1,2)"])
    grid = space.grid()  # x: [0.1, 0.2, 0.30000000000000004, 0.4]
    assert _grid.warm_starts_on_grid(grid, [{"x": 0.3, "y": 2}]) == ({"x": grid["x"][2], "y": 2},)
    with pytest.raises(SweeperConfigError) as e:
        _grid.warm_starts_on_grid(grid, [{"x": 0.1, "y": 1}, {"x": 0.3}])
    text = str(e.value)
    assert "enqueue_trials[1]" in text and "leaves out ['y']" in text and "y: [1, 2]" in text, text
    with pytest.raises(SweeperConfigError) as e:  # a grid given in the sampler node, narrower than the space
        _grid.warm_starts_on_grid({"x": [0.1, 0.2], "y": [1, 2]}, [{"x": 0.4, "y": 1}])
    text = str(e.value)
    assert "enqueue_trials[0]: x=0.4 is not a point of the grid" in text and "[0.1, 0.2]" in text, text


def test_c36_a_warm_start_is_queued_again_only_when_every_run_failed(tmp_path, caplog):
    """One log line per warm start says what happens; a FAIL run is replaced in the budget by its re-queue;
    refit's ``enqueued`` names each warm start's last COMPLETE run."""
    space = build_search_space({}, ["x=interval(0,1)"])
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/db.sqlite")
    warm = ({"x": 0.1}, {"x": 0.2}, {"x": 0.3}, {"x": 0.4})
    _queue.enqueue_warm_starts(study, warm, space)
    for state in (TrialState.FAIL, TrialState.COMPLETE, TrialState.PRUNED):  # 0.4 stays WAITING
        trial = study.ask(fixed_distributions=space.distributions())
        study.tell(trial, 1.0 if state == TrialState.COMPLETE else None, state=state)
    assert _queue.counted_trials(study) == 3

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hydra_plugins.ds_optuna_sweeper._study._study"):
        _queue.enqueue_warm_starts(study, warm, space)  # the same command again
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Warm start")]
    assert lines == [
        "Warm start {x: 0.1}: failed before (trial 0); queued again (trial 4)",
        "Warm start {x: 0.2}: ran before (trial 1, COMPLETE); not queued again",
        "Warm start {x: 0.3}: ran before (trial 2, PRUNED); not queued again",
        "Warm start {x: 0.4}: already queued (trial 3); not queued twice",
    ], lines
    assert len(study.trials) == 5 and _queue.counted_trials(study) == 2  # trial 0's re-queue replaces it
    assert study.trials[4].system_attrs["failed_trial"] == 0

    for _ in range(2):  # 0.4 (trial 3) COMPLETE, then 0.1 (trial 4) FAIL again
        trial = study.ask(fixed_distributions=space.distributions())
        study.tell(trial, 2.0 if trial.params["x"] == 0.4 else None,
                   state=TrialState.COMPLETE if trial.params["x"] == 0.4 else TrialState.FAIL)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hydra_plugins.ds_optuna_sweeper._study._study"):
        _queue.enqueue_warm_starts(study, warm[:1], space)
    assert [r.getMessage() for r in caplog.records] == ["Warm start {x: 0.1}: failed before (trials 0, 4); queued again (trial 5)"]
    trial = study.ask(fixed_distributions=space.distributions())
    assert trial.number == 5 and trial.params == {"x": 0.1}
    study.tell(trial, 0.5)
    assert _queue.counted_trials(study) == 4  # 0.2, 0.3, 0.4 and the last 0.1; its two failures are replaced
    assert _queue.warm_start_runs(study.trials) == [1, 3, 5]


# --- the real command line --------------------------------------------------------------------


def _sweep(tmp_path: Path, *overrides: str, env: dict | None = None):
    """``python tests/apps/warm_start_app.py -m ...`` in process."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30",
            "hydra.sweeper.plots=false", *overrides]
    return run_app("warm_start_app", args, config_name="app", env={"DSO_RECORD_DIR": str(tmp_path / "rec"), **(env or {})})


def _load(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="warm_start_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")


def _record(tmp_path: Path, stage: str, number: int, rank: int) -> dict:
    return json.loads((tmp_path / "rec" / f"{stage}_trial{number}_rank{rank}.json").read_text())


@pytest.mark.timeout(120)
def test_c32_grid_sweep_with_warm_starts_runs_each_point_once(tmp_path):
    """The case on the command line, maximised so the best is the point the old code never ran (0.4); n_trials
    above the grid size stops at the grid's end; the same sweep resumed with one more warm start (a
    point that ran) and a bigger budget runs nothing again."""
    command = ["hydra/sweeper/sampler=grid", GRID_X, "hydra.sweeper.direction=maximize",
               "hydra.sweeper.enqueue_trials=[{x:0.1},{x:0.2}]"]
    res = _sweep(tmp_path, *command, "hydra.sweeper.n_trials=6").check()
    study = _load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4, [(t.number, t.state) for t in study.trials]
    assert sorted(t.params["x"] for t in study.trials) == [0.1, 0.2, 0.3, 0.4]
    assert [t.params["x"] for t in study.trials[:2]] == [0.1, 0.2]  # the warm starts, first
    for t in study.trials:
        assert _record(tmp_path, "sweep", t.number, 0)["config"]["x"] == t.params["x"]
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert results["best_params"] == {"x": 0.4} and results["best_value"] == pytest.approx(0.4 ** 2 + 1)
    assert "every grid point was tried" in res.output, res.output[-3000:]

    res = _sweep(tmp_path, *command[:-1], "hydra.sweeper.enqueue_trials=[{x:0.1},{x:0.2},{x:0.3}]",
                 "hydra.sweeper.n_trials=8").check()
    assert len(_load(tmp_path).trials) == 4, [(t.number, t.params) for t in _load(tmp_path).trials]
    assert "Warm start {x: 0.1}: ran before (trial 0, COMPLETE); not queued again" in res.output, res.output[-3000:]
    assert "Warm start {x: 0.3}: ran before (trial " in res.output
    assert "every grid point was tried" in res.output
    assert "re-evaluating a configuration" not in res.output  # Optuna's warning when a done grid is asked again


@pytest.mark.timeout(60)
def test_c32_a_warm_start_that_is_no_grid_point_is_refused_before_trial_0(tmp_path):
    """A warm start leaving out a grid param failed mid-sweep inside Optuna ("All
    parameters must be specified when using GridSampler with enqueue_trial") after other trials ran."""
    res = _sweep(tmp_path, "hydra/sweeper/sampler=grid", GRID_X, "y=choice(1,2)",
                 "hydra.sweeper.enqueue_trials=[{x:0.1,y:1},{x:0.2}]")
    assert res.returncode != 0
    assert "hydra.sweeper.enqueue_trials[1] = {'x': 0.2} leaves out ['y']" in res.output, res.output[-3000:]
    assert "grid: {x: [0.1, 0.2, 0.3, 0.4], y: [1, 2]}" in res.output
    assert not (tmp_path / "rec").exists() and not (tmp_path / "sweep" / "optuna.db").exists()


@pytest.mark.timeout(120)
def test_c36_a_failed_warm_start_runs_again_on_the_same_command_and_is_refit(tmp_path):
    """The case on the command line: the warm start 0.1 fails on a config error (a flag file), which stops the
    sweep (max_failure_rate=0) with 0.2 still queued; the user fixes the config and runs the same command:
    0.1 is queued again and COMPLETEs, 0.2 runs once, the budget counts 0.1 once, and the refit of the
    warm starts runs 0.2 and 0.1's COMPLETE run."""
    flag = tmp_path / "broken"
    flag.write_text("0.1")
    command = ["x=interval(0,1)", "hydra.sweeper.n_trials=3", "hydra.sweeper.enqueue_trials=[{x:0.1},{x:0.2}]",
               "hydra.sweeper.refit.enabled=true", "hydra.sweeper.refit.trials=[enqueued]",
               "hydra.sweeper.refit.overrides=['label=final']"]
    env = {"DSO_BROKEN_FLAG": str(flag)}
    first = _sweep(tmp_path, *command, env=env)
    assert first.returncode != 0 and "config error for x=0.1" in first.output, first.output[-3000:]
    assert "hydra.sweeper.max_failure_rate=0" in first.output, first.output[-3000:]
    assert [(t.state, t.params.get("x")) for t in _load(tmp_path).trials] == [(TrialState.FAIL, 0.1),
                                                                              (TrialState.WAITING, None)]

    flag.unlink()  # the config is fixed
    res = _sweep(tmp_path, *command, env=env).check()
    assert "Warm start {x: 0.1}: failed before (trial 0); queued again (trial 2)" in res.output, res.output[-3000:]
    assert "Warm start {x: 0.2}: already queued (trial 1); not queued twice" in res.output
    study = _load(tmp_path)
    states = [(t.number, t.state, t.params["x"]) for t in study.trials]
    assert states[:3] == [(0, TrialState.FAIL, 0.1), (1, TrialState.COMPLETE, 0.2), (2, TrialState.COMPLETE, 0.1)], states
    assert len(states) == 4 and states[3][1] == TrialState.COMPLETE  # n_trials=3: trial 0's failure is replaced
    assert _record(tmp_path, "sweep", 2, 0)["config"]["x"] == 0.1
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    refits = {r["trial"]: r for r in results["refit"]}
    assert set(refits) == {1, 2}, results["refit"]
    assert refits[2]["state"] == "COMPLETE" and refits[2]["metrics"] == {"value": pytest.approx(0.1 ** 2 + 1 + 10)}
    assert _record(tmp_path, "refit", 2, 0)["config"]["x"] == 0.1
