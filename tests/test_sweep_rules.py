"""What rank 0 alone decides in a sweep, in process at world size 1 (``tests/in_process.py``).

Moved from the 2-rank launches of ``tests/multirank/test_sweep.py`` (issue 39 item 1): range params with the
random and grid samplers (C11), distributions stored and logged once (C12), exact types of override values, a
NaN result, resume counting, the timeout (C13), enqueued trials, seed repeats, the failure rate, and the
refusals before anything runs. The rank-1 side of each is the broadcast payload, which
``tests/multirank/test_sweep.py::test_c01_one_study_one_sampler_same_config_on_every_rank`` checks once; a
refusal ending every rank the same way is ``tests/multirank/test_setup_refusal.py``'s launch.
"""

import re

import pytest
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper import SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._loop._trial_groups import plan_groups
from tests.in_process import sweep
from tests.multirank.sweep_helpers import load, records

C, F = TrialState.COMPLETE, TrialState.FAIL


def _job_dirs(tmp_path):
    return sorted((p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir() and p.name != "plots"), key=int)


def test_c11_range_with_the_random_sampler(tmp_path):
    sweep(tmp_path, "hydra.sweeper.n_trials=4", "hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=1",
          "y=range(1,3)").check()
    study = load(tmp_path)
    assert {t.params["y"] for t in study.trials} == {1, 2}
    assert isinstance(study.trials[0].distributions["y"], IntDistribution)
    assert {r["config"]["y"] for r in records(tmp_path).values()} == {1, 2}


def test_c11_the_grid_stops_when_every_point_was_tried(tmp_path):
    """The grid is exhausted after 3 points; the sweep stops there although n_trials=10."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=10", "hydra/sweeper/sampler=grid", "y=range(1,10,step=4)").check()
    study = load(tmp_path)
    assert sorted(t.params["y"] for t in study.trials) == [1, 5, 9]
    assert all(t.state == C for t in study.trials)
    assert "every grid point was tried" in res.output


def test_c12_distributions_logged_once_and_stored(tmp_path):
    res = sweep(tmp_path, "hydra.sweeper.n_trials=2", "lr=interval(1e-6,1e-3)", "x=tag(log,interval(1e-5,1e-3))",
                "y=int(interval(1,5))").check()
    d = load(tmp_path).trials[0].distributions
    assert d["lr"] == FloatDistribution(1e-6, 1e-3)
    assert d["x"] == FloatDistribution(1e-5, 1e-3, log=True)
    assert d["y"] == IntDistribution(1, 5)
    assert res.output.count("Search space:") == 1
    assert "x: float in [1e-05, 0.001], log" in res.output
    assert len(re.findall(r"'lr=interval\(1e-6,1e-3\)' is linear but spans 3.0 decades", res.output)) == 1


def test_override_values_reach_the_task_with_exact_types(tmp_path):
    sweep(tmp_path, "hydra.sweeper.n_trials=6", "hydra/sweeper/sampler=grid",
          "label='with space','1','null','x=y,z',plain,'it\\'s'").check()
    study = load(tmp_path)
    recs = records(tmp_path)
    assert sorted(t.params["label"] for t in study.trials) == sorted(["with space", "1", "null", "x=y,z", "plain", "it's"])
    for t in study.trials:
        assert recs[(t.number, 0)]["config"]["label"] == t.params["label"]
        assert recs[(t.number, 0)]["types"]["label"] == "str"


def test_nan_is_fail_and_ignored_by_results(tmp_path):
    sweep(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.max_failure_rate=1.0", "x=interval(-1,1)",
          "nan_on_rank=0", "hydra.sweeper.direction=maximize").check()
    assert [t.state for t in load(tmp_path).trials] == [F, F]
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert "best_value" not in results and results.states.FAIL == 2


def test_a_failed_trial_under_the_failure_rate_lets_the_sweep_go_on(tmp_path):
    """Rank 0's side of C06 (the 2-rank agreement is
    ``tests/faults/test_faults.py::test_a_failure_on_one_rank_*``): the task's exception fails its trial only."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=3", "hydra.sweeper.max_failure_rate=1.0", "x=interval(-1,1)",
                "fail_on_rank=0", "fail_on_trial=1").check()
    assert [t.state for t in load(tmp_path).trials] == [C, F, C]
    assert "injected failure on rank 0" in res.output
    assert "rank 0/1, trial 1 failed" in res.output


def test_failure_rate_zero_stops_at_the_first_failure_naming_the_setting(tmp_path):
    """Rank 0's verdict of C07 (every rank's exit 1 is
    ``tests/faults/test_faults.py::test_a_failure_on_one_rank_*``)."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "fail_on_rank=0")
    assert res.returncode == 1
    assert [t.state for t in load(tmp_path).trials] == [F]
    assert "max_failure_rate=0.0" in res.output
    assert "injected failure on rank 0" in res.output


def test_resume_counts_stored_trials_and_never_reuses_job_dirs(tmp_path):
    sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)").check()
    res = sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)").check()
    assert "(2 already counted)" in res.output
    assert [t.number for t in load(tmp_path).trials] == [0, 1, 2, 3]
    sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)").check()
    assert len(load(tmp_path).trials) == 4
    assert _job_dirs(tmp_path) == ["0", "1", "2", "3"]


def test_n_jobs_that_does_not_divide_a_world_of_two_is_refused_naming_what_works():
    """Inside torchrun ``n_jobs`` is the number of trial groups (issue 23): 3 cannot split 2 ranks evenly. The
    rule as rank 0 applies it (every rank refusing alike is ``test_setup_refusal.py``'s launch)."""
    with pytest.raises(SweeperConfigError) as e:
        plan_groups(3, 2, 2)
    assert "n_jobs=3 does not divide the torchrun world of 2 ranks" in str(e.value)
    assert "use one of: 1 (2 ranks a trial), 2 (1 rank a trial)" in str(e.value)


@pytest.mark.parametrize("overrides, message", [
    (("x=interval(1,-1)",), "'x=interval(1,-1)' is reversed or empty"),
    (("hydra/sweeper/pruner=median", "hydra.sweeper.direction=[minimize,maximize]"), "with 2 objectives"),
    (("hydra.sweeper.storage=postgresql://nobody@127.0.0.1:1/none",),
     "Cannot open the Optuna storage 'postgresql://nobody@127.0.0.1:1/none'"),
    (("hydra.sweeper.storage=notascheme",), "Cannot open the Optuna storage 'notascheme'"),
    (("hydra.sweeper.enqueue_trials=[{x:5.0}]",), "x=5.0 is outside its distribution"),
    (("hydra.sweeper.repeats=2",), "needs hydra.sweeper.seed_key"),
    (("xx=interval(0,1)",), "'xx' is not a key of the task's config (write '+xx=...' to add it)"),
])
def test_refused_before_any_trial_runs(tmp_path, overrides, message):
    """Each refusal: exit 1, the message, no task run; a key the config lacks is refused before the study is
    even opened (it failed every trial at compose time and filled the study with FAIL trials)."""
    res = sweep(tmp_path, "x=interval(-1,1)", *overrides)
    assert res.returncode == 1, res.output[-3000:]
    assert message in res.output, res.output[-3000:]
    assert not (tmp_path / "records").exists()
    if overrides[0].startswith("xx="):
        assert not (tmp_path / "sweep" / "optuna.db").exists()


def test_bad_search_space_is_said_once_by_rank_0(tmp_path):
    res = sweep(tmp_path, "x=interval(1,-1)")
    assert res.returncode == 1
    assert res.output.count("Sweep set-up failed on rank 0: SearchSpaceError") == 1, res.output[-3000:]
    assert "could not start the sweep" not in res.output


def test_an_added_key_is_searched(tmp_path):
    sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "+extra=interval(0,1)").check()
    assert [sorted(t.params) for t in load(tmp_path).trials] == [["extra", "x"]] * 2


def test_world_size_one_runs_the_same_loop_and_batches_n_jobs(tmp_path):
    res = sweep(tmp_path, "hydra.sweeper.n_trials=5", "hydra.sweeper.n_jobs=2", "x=interval(-1,1)").check()
    study = load(tmp_path)
    assert len(study.trials) == 5 and all(t.state == C for t in study.trials)
    recs = records(tmp_path)
    assert sorted(recs) == [(n, 0) for n in range(5)]
    for t in study.trials:
        assert recs[(t.number, 0)]["config"]["x"] == t.params["x"]
        assert recs[(t.number, 0)]["trial_params"] == t.params
    assert res.output.count("Launching 2 jobs locally") == 2


def test_c13_timeout_stops_after_the_trial_it_was_reached_in(tmp_path):
    """The timeout counts from the first ask, so load only makes trials slower: trial 0 always runs, and
    trials of at least 0.4 s asked within 1 s are at most 3 (asked at >= 0, 0.4, 0.8 s). Every rank stopping
    after the same trial is the agreed loop of the 2-rank launches."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=100", "hydra.sweeper.timeout=1", "sleep_s=0.4",
                "x=interval(-1,1)").check()
    study = load(tmp_path)
    assert 1 <= len(study.trials) <= 3
    assert all(t.state == C for t in study.trials)
    assert sorted(records(tmp_path)) == [(t.number, 0) for t in study.trials]
    assert "hydra.sweeper.timeout=1 s reached" in res.output


def test_c13_timeout_counts_from_the_first_ask_not_from_the_set_up(tmp_path):
    """1 ms is less than opening the study and starting the runner take: counted from the launch it would
    leave no trial; counted from the first ask (as Optuna's study.optimize) it leaves exactly one."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=100", "hydra.sweeper.timeout=0.001", "sleep_s=0.1",
                "x=interval(-1,1)").check()
    assert [t.state for t in load(tmp_path).trials] == [C]
    assert "hydra.sweeper.timeout=0.001 s reached" in res.output
    # The ETA is the timeout's time left (0 s here), not 99 more trials at this trial's pace.
    assert re.search(r"\[1/100\] Trial 0 COMPLETE .*; ETA 0 s", res.output), res.output[-2000:]


def test_stored_study_is_protected_from_other_directions_and_changed_ranges(tmp_path):
    """Both checks are rank 0's, before the loop; allow_search_space_change then lets the new range run."""
    sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)").check()
    res = sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "hydra.sweeper.direction=maximize")
    assert res.returncode == 1 and "was created with direction(s) ['minimize']" in res.output
    res = sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-2,1)")
    assert res.returncode == 1
    assert "'x': stored float in [-1.0, 1.0], now float in [-2.0, 1.0]" in res.output
    assert "Sweep set-up failed on rank 0" in res.output and "could not start the sweep" not in res.output
    study = load(tmp_path)
    assert len(study.trials) == 2 and all(t.state == C for t in study.trials)
    sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-2,1)", "hydra.sweeper.allow_search_space_change=true").check()
    assert len(load(tmp_path).trials) == 3


def test_enqueue_trials_run_first_and_are_not_repeated_on_resume(tmp_path):
    q = "hydra.sweeper.enqueue_trials=[{x:0.25,y:2},{x:-0.5,y:1}]"
    sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "y=range(1,3)", q).check()
    study = load(tmp_path)
    assert [t.params for t in study.trials[:2]] == [{"x": 0.25, "y": 2}, {"x": -0.5, "y": 1}]
    assert records(tmp_path)[(0, 0)]["config"]["x"] == 0.25
    sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "y=range(1,3)", q).check()
    study = load(tmp_path)
    assert len(study.trials) == 4
    assert sum(t.params == {"x": 0.25, "y": 2} for t in study.trials) == 1


def test_seed_repeats_tell_the_mean_and_hide_the_seed_from_the_sampler(tmp_path):
    import json

    sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "hydra.sweeper.repeats=3",
          "hydra.sweeper.seed_key=seed", "hydra.sweeper.seeds=[3,5,7]", env={"DSO_RECORD_SEED": "1"}).check()
    for t in load(tmp_path).trials:
        assert set(t.params) == {"x"}  # the sampler never sees the seed
        per_seed = t.user_attrs["ds_optuna:seed_values"]
        assert sorted(per_seed) == ["3", "5", "7"]
        for seed, values in per_seed.items():
            assert values == [pytest.approx(t.params["x"] ** 2 + 1 + 0.1 * int(seed))]
            rec = json.loads((tmp_path / "records" / f"trial{t.number}_seed{seed}_rank0.json").read_text())
            assert rec["seed"] == int(seed)
            assert rec["output_dir"] == str(tmp_path / "sweep" / str(t.number) / f"seed{seed}")
        assert t.value == pytest.approx(sum(v[0] for v in per_seed.values()) / 3)
