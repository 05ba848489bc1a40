"""The sweeper under real torchrun (2 ranks, CPU, gloo) with the tiny test app.

Cases from docs/cases.md: C01, C08, C11, C12, C06/C07 basics, and the config check.
"""

import re

import pytest
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState

from .sweep_helpers import LINGER, exit_lines, exit_statuses, load, records, run_sweep

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(240)]


def _assert_ranks_agree(recs, numbers, nproc=2):
    for n in numbers:
        per_rank = [recs[(n, r)] for r in range(nproc)]
        assert len({r["config_hash"] for r in per_rank}) == 1, f"trial {n}: configs differ"
        assert len({r["output_dir"] for r in per_rank}) == 1, f"trial {n}: job dirs differ"
        assert all(r["trial_number"] == n for r in per_rank)
        assert all(r["trial_params"] == per_rank[0]["trial_params"] for r in per_rank)


def test_c01_one_study_one_sampler_same_config_on_every_rank(tmp_path):
    spy = tmp_path / "spy"
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "model.hidden=choice(16,32,64)", "x=interval(-1,1)",
                    env={"DSO_SPY_DIR": str(spy)}).check()
    study = load(tmp_path)
    assert len(study.trials) == 3
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    recs = records(tmp_path)
    assert sorted(recs) == [(n, r) for n in range(3) for r in range(2)]
    _assert_ranks_agree(recs, range(3))
    for t in study.trials:
        for r in range(2):
            cfg = recs[(t.number, r)]["config"]
            assert cfg["model"]["hidden"] == t.params["model.hidden"]
            assert cfg["x"] == t.params["x"]  # exact float64 on every rank
            assert t.values[0] == cfg["x"] ** 2 + cfg["y"]
    # Rank 0 alone opened the storage and the study and asked it (these are also the spy's positive
    # controls); rank 1 touched none of the storage's entry points the spy wraps (tests/apps/sweep_app.py:
    # any storage class built, get_storage, fail_stale_trials, a Study built, create/load_study, ask).
    assert (spy / "ask_rank0.txt").read_text().count("x") == 3
    for label in ("create_study", "Study.__init__", "RDBStorage.__init__", "fail_stale_trials"):
        assert (spy / f"{label}_rank0.txt").exists(), (label, sorted(p.name for p in spy.iterdir()))
    assert sorted(p.name for p in spy.iterdir() if "rank1" in p.name) == []
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert results.best_trial == study.best_trial.number
    assert results.best_value == study.best_value
    assert res.output.count("Search space:") == 1


def test_c08_one_sweep_dir_when_a_rank_starts_late(tmp_path):
    from tests.torchrun_utils import run_torchrun

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run_torchrun(
        "tests/apps/sweep_app.py",
        ["-m", "hydra.sweep.dir=multirun/${now:%Y-%m-%d_%H-%M-%S}", "hydra.sweeper.n_trials=2", "x=interval(-1,1)",
         "hydra.sweeper.rank_timeout=30"],
        cwd=cwd,
        extra_env={"DSO_DELAY_RANK": "1", "DSO_DELAY_S": "1.5", "DSO_RECORD_DIR": str(tmp_path / "rec2")},
    ).check()
    sweep_dirs = list((cwd / "multirun").iterdir())
    assert len(sweep_dirs) == 1, sweep_dirs
    sweep = sweep_dirs[0]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name != "plots") == ["0", "1"]
    for n in (0, 1):
        job = sweep / str(n)
        # One .hydra/ per job, written by rank 0 alone (its per-rank log name is in hydra.yaml).
        hydra_yaml = (job / ".hydra" / "hydra.yaml").read_text()
        assert "_rank0.log" in hydra_yaml and "_rank1.log" not in hydra_yaml
        assert sorted(p.name for p in job.glob("*.log")) == ["sweep_app_rank0.log", "sweep_app_rank1.log"]
    import json

    # trial<N>_rank<R>.json only: the app also writes span_trial<N>_rank<R>.json (each trial's start and end)
    recs = [json.loads(p.read_text()) for p in (tmp_path / "rec2").glob("trial*_rank*.json")]
    assert len(recs) == 4
    assert {r["output_dir"] for r in recs} == {str(sweep / "0"), str(sweep / "1")}


def test_c11_range_with_random_and_grid_samplers(tmp_path):
    run_sweep(tmp_path / "random", "hydra.sweeper.n_trials=8", "hydra/sweeper/sampler=random",
              "hydra.sweeper.sampler.seed=1", "y=range(1,3)").check()
    study = load(tmp_path / "random")
    assert {t.params["y"] for t in study.trials} == {1, 2}
    assert isinstance(study.trials[0].distributions["y"], IntDistribution)
    recs = records(tmp_path / "random")
    assert {r["config"]["y"] for r in recs.values()} == {1, 2}

    # The grid is exhausted after 3 points; the sweep stops there although n_trials=10.
    res = run_sweep(tmp_path / "grid", "hydra.sweeper.n_trials=10", "hydra/sweeper/sampler=grid",
                    "y=range(1,10,step=4)").check()
    study = load(tmp_path / "grid")
    assert sorted(t.params["y"] for t in study.trials) == [1, 5, 9]
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert "every grid point was tried" in res.output


def test_c12_distributions_logged_once_and_stored(tmp_path):
    res = run_sweep(
        tmp_path, "hydra.sweeper.n_trials=2", "lr=interval(1e-6,1e-3)", "x=tag(log,interval(1e-5,1e-3))",
        "y=int(interval(1,5))",
    ).check()
    study = load(tmp_path)
    d = study.trials[0].distributions
    assert d["lr"] == FloatDistribution(1e-6, 1e-3)
    assert d["x"] == FloatDistribution(1e-5, 1e-3, log=True)
    assert d["y"] == IntDistribution(1, 5)
    assert res.output.count("Search space:") == 1
    assert "x: float in [1e-05, 0.001], log" in res.output
    assert len(re.findall(r"'lr=interval\(1e-6,1e-3\)' is linear but spans 3.0 decades", res.output)) == 1


def test_override_values_reach_the_task_with_exact_types(tmp_path):
    run_sweep(
        tmp_path, "hydra.sweeper.n_trials=6", "hydra/sweeper/sampler=grid",
        "label='with space','1','null','x=y,z',plain,'it\\'s'",
    ).check()
    study = load(tmp_path)
    recs = records(tmp_path)
    assert sorted(t.params["label"] for t in study.trials) == sorted(["with space", "1", "null", "x=y,z", "plain", "it's"])
    for t in study.trials:
        for r in range(2):
            assert recs[(t.number, r)]["config"]["label"] == t.params["label"]
            assert recs[(t.number, r)]["types"]["label"] == "str"


def test_config_mismatch_between_ranks_fails_the_trial_and_names_the_key(tmp_path):
    res = run_sweep(
        tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.max_failure_rate=1.0", "x=interval(-1,1)",
        "+rank_env=${oc.env:RANK}",
    ).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    assert "ConfigMismatchError" in res.output
    assert "at ['rank_env']" in res.output
    assert records(tmp_path) == {}  # no rank ran the task


def test_failure_on_one_rank_is_agreed_and_the_sweep_goes_on(tmp_path):
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "hydra.sweeper.max_failure_rate=1.0",
                    "x=interval(-1,1)", "fail_on_rank=1", "fail_on_trial=1").check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert "injected failure on rank 1" in res.output
    assert "rank 1/2, trial 1 failed" in res.output


def test_failure_rate_zero_stops_every_rank_non_zero(tmp_path):
    """Each rank's own process exits 1 (read from the app's per-rank exit lines, not torchrun's code)."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "fail_on_rank=1",
                    "hydra.sweeper.plots=false", env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.FAIL]
    assert "max_failure_rate=0.0" in res.output
    assert "injected failure on rank 1" in res.output


def test_nan_on_rank0_is_fail_and_ignored_by_results(tmp_path):
    run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.max_failure_rate=1.0", "x=interval(-1,1)",
              "nan_on_rank=0", "hydra.sweeper.direction=maximize").check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert "best_value" not in results and results.states.FAIL == 2


def test_resume_counts_stored_trials_and_never_reuses_job_dirs(tmp_path):
    run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)").check()
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)").check()
    assert "(2 already counted)" in res.output
    study = load(tmp_path)
    assert [t.number for t in study.trials] == [0, 1, 2, 3]
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)").check()
    assert len(load(tmp_path).trials) == 4
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir() and p.name != "plots") == ["0", "1", "2", "3"]


def test_n_jobs_that_does_not_divide_the_world_is_refused(tmp_path):
    """Inside torchrun ``n_jobs`` is the number of trial groups (issue 23): 3 cannot split 2 ranks evenly, and
    every rank says so before anything runs."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_jobs=3", "x=interval(-1,1)", env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)  # refused on every rank
    # rank 0's line and torchrun's report of it (rank 0's error file), not once per rank (issue 38, C59)
    assert res.output.count("n_jobs=3 does not divide the torchrun world of 2 ranks") == 2, res.output[-3000:]
    assert "rank 1/2: hydra.sweeper refused" not in res.output
    assert "use one of: 1 (2 ranks a trial), 2 (1 rank a trial)" in res.output
    assert not (tmp_path / "records").exists()


def test_bad_search_space_is_refused_on_every_rank_before_training(tmp_path):
    res = run_sweep(tmp_path, "x=interval(1,-1)", env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    assert "'x=interval(1,-1)' is reversed or empty" in res.output
    assert "Sweep set-up failed on rank 0: SearchSpaceError" in res.output  # said once, by rank 0 (issue 38, C59)
    assert "could not start the sweep" not in res.output
    assert not (tmp_path / "records").exists()


def test_a_searched_key_the_config_lacks_is_refused_before_anything_is_stored(tmp_path):
    """'xx=interval(...)' for a config without 'xx' failed in every trial at compose time and filled the
    study with FAIL trials counted against n_trials; now refused before the study is asked, with the '+'
    form named. '+extra=...' (an added key) still runs."""
    res = run_sweep(tmp_path, "x=interval(-1,1)", "xx=interval(0,1)", nproc=1)
    assert res.returncode != 0
    assert "'xx' is not a key of the task's config (write '+xx=...' to add it)" in res.output, res.output[-3000:]
    assert not (tmp_path / "records").exists()
    assert not (tmp_path / "sweep" / "optuna.db").exists()  # the study was not even opened
    run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "+extra=interval(0,1)", nproc=1).check()
    assert [sorted(t.params) for t in load(tmp_path).trials] == [["extra", "x"]] * 2


def test_world_size_one_runs_the_same_loop_and_batches_n_jobs(tmp_path):
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=5", "hydra.sweeper.n_jobs=2", "x=interval(-1,1)", nproc=1).check()
    study = load(tmp_path)
    assert len(study.trials) == 5 and all(t.state == TrialState.COMPLETE for t in study.trials)
    recs = records(tmp_path)
    assert sorted(recs) == [(n, 0) for n in range(5)]
    for t in study.trials:
        assert recs[(t.number, 0)]["config"]["x"] == t.params["x"]
        assert recs[(t.number, 0)]["trial_params"] == t.params
    assert res.output.count("Launching 2 jobs locally") == 2


def test_c05_pruning_decided_on_rank0_stops_every_rank_at_the_same_step(tmp_path):
    run_sweep(
        tmp_path, "hydra.sweeper.n_trials=5", "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=2",
        "hydra.sweeper.pruner.n_warmup_steps=1", "steps=4", "x=interval(-1,1)", "hydra/sweeper/sampler=random",
    ).check()
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert states[:2] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert states[2:] == [TrialState.PRUNED] * 3
    import json

    for t in study.trials[2:]:
        steps = [json.loads((tmp_path / "records" / f"pruned_trial{t.number}_rank{r}.json").read_text())["step"]
                 for r in range(2)]
        assert steps == [1, 1]  # first step after the warm-up, on both ranks
        assert t.intermediate_values == {0: 10.0 * t.number + t.params["x"] ** 2, 1: 10.0 * t.number + t.params["x"] ** 2 - 0.1}


def test_define_by_run_values_are_identical_on_every_rank_and_stored(tmp_path):
    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "suggest=true", "x=interval(-1,1)").check()
    study = load(tmp_path)
    import json

    for t in study.trials:
        per_rank = [json.loads((tmp_path / "records" / f"suggest_trial{t.number}_rank{r}.json").read_text()) for r in range(2)]
        assert per_rank[0] == per_rank[1]
        assert per_rank[0] == {k: repr(t.params[k]) for k in ("s_float", "s_int", "s_cat")}  # exact float64 repr
        assert t.state == TrialState.COMPLETE


def test_c13_timeout_stops_all_ranks_after_the_same_trial(tmp_path):
    # The timeout counts from the first ask, so load only makes trials slower: trial 0 always runs, and
    # trials of at least 0.4 s asked within 1 s are at most 3 (asked at >= 0, 0.4, 0.8 s).
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=100", "hydra.sweeper.timeout=1", "sleep_s=0.4",
                    "x=interval(-1,1)", timeout_s=120).check()
    study = load(tmp_path)
    assert 1 <= len(study.trials) <= 3
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    recs = records(tmp_path)
    assert sorted(recs) == [(t.number, r) for t in study.trials for r in range(2)]
    assert "hydra.sweeper.timeout=1 s reached" in res.output


def test_c13_timeout_counts_from_the_first_ask_not_from_the_set_up(tmp_path):
    # 1 ms is less than opening the study and starting the runner take: counted from the launch it
    # would leave no trial; counted from the first ask (as Optuna's study.optimize) it leaves exactly one.
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=100", "hydra.sweeper.timeout=0.001", "sleep_s=0.1",
                    "x=interval(-1,1)", nproc=1, timeout_s=120).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE]
    assert "hydra.sweeper.timeout=0.001 s reached" in res.output
    # The ETA is the timeout's time left (0 s here), not 99 more trials at this trial's pace.
    assert re.search(r"\[1/100\] Trial 0 COMPLETE .*; ETA 0 s", res.output), res.output[-2000:]


def test_pruner_with_several_objectives_is_refused(tmp_path):
    res = run_sweep(tmp_path, "hydra/sweeper/pruner=median", "hydra.sweeper.direction=[minimize,maximize]",
                    "x=interval(-1,1)", env=LINGER)
    assert res.returncode != 0
    assert "with 2 objectives" in res.output
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)  # refused on every rank


def test_stored_study_is_protected_from_other_directions_and_changed_ranges(tmp_path):
    """Both checks are rank 0's, before the loop: the direction one at world size 1, the range one at 2
    ranks, where every rank's own process exits 1; allow_search_space_change then lets the same range run."""
    run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", nproc=1).check()
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "hydra.sweeper.direction=maximize",
                    nproc=1)
    assert res.returncode != 0 and "was created with direction(s) ['minimize']" in res.output
    assert exit_statuses(tmp_path) == {0: 1}, exit_lines(tmp_path)
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-2,1)", env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    assert "'x': stored float in [-1.0, 1.0], now float in [-2.0, 1.0]" in res.output
    assert "Sweep set-up failed on rank 0" in res.output and "could not start the sweep" not in res.output
    study = load(tmp_path)
    assert len(study.trials) == 2 and all(t.state == TrialState.COMPLETE for t in study.trials)
    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-2,1)", "hydra.sweeper.allow_search_space_change=true",
              nproc=1).check()
    assert len(load(tmp_path).trials) == 3


def test_unreachable_storage_is_a_clear_error(tmp_path):
    """A server that does not answer, at 2 ranks (every rank's own process exits 1), and a URL that is no URL,
    at world size 1 (the same set-up failure on rank 0, another error to name)."""
    res = run_sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.storage=postgresql://nobody@127.0.0.1:1/none",
                    env=LINGER)
    assert res.returncode != 0
    assert "Cannot open the Optuna storage 'postgresql://nobody@127.0.0.1:1/none'" in res.output
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    res = run_sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.storage=notascheme", nproc=1)
    assert res.returncode != 0 and "Cannot open the Optuna storage 'notascheme'" in res.output
    assert exit_statuses(tmp_path) == {0: 1}, exit_lines(tmp_path)


def test_enqueue_trials_run_first_on_every_rank_and_are_not_repeated(tmp_path):
    q = "hydra.sweeper.enqueue_trials=[{x:0.25,y:2},{x:-0.5,y:1}]"
    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "y=range(1,3)", q).check()
    study = load(tmp_path)
    assert [t.params for t in study.trials[:2]] == [{"x": 0.25, "y": 2}, {"x": -0.5, "y": 1}]
    recs = records(tmp_path)
    assert [recs[(0, r)]["config"]["x"] for r in range(2)] == [0.25, 0.25]
    # The resume and the refusal are rank 0's queue and set-up: world size 1.
    run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "y=range(1,3)", q, nproc=1).check()
    study = load(tmp_path)
    assert len(study.trials) == 4
    assert sum(t.params == {"x": 0.25, "y": 2} for t in study.trials) == 1
    res = run_sweep(tmp_path / "bad", "x=interval(-1,1)", "hydra.sweeper.enqueue_trials=[{x:5.0}]", nproc=1)
    assert res.returncode != 0 and "x=5.0 is outside its distribution" in res.output


def test_seed_repeats_tell_the_mean_and_hide_the_seed_from_the_sampler(tmp_path):
    run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "hydra.sweeper.repeats=3",
              "hydra.sweeper.seed_key=seed", "hydra.sweeper.seeds=[3,5,7]", env={"DSO_RECORD_SEED": "1"}).check()
    study = load(tmp_path)
    import json

    for t in study.trials:
        assert set(t.params) == {"x"}  # the sampler never sees the seed
        per_seed = t.user_attrs["ds_optuna:seed_values"]
        assert sorted(per_seed) == ["3", "5", "7"]
        for seed, values in per_seed.items():
            assert values == [pytest.approx(t.params["x"] ** 2 + 1 + 0.1 * int(seed))]
            for r in range(2):
                rec = json.loads((tmp_path / "records" / f"trial{t.number}_seed{seed}_rank{r}.json").read_text())
                assert rec["seed"] == int(seed)
                assert rec["output_dir"] == str(tmp_path / "sweep" / str(t.number) / f"seed{seed}")
        assert t.value == pytest.approx(sum(v[0] for v in per_seed.values()) / 3)
    res = run_sweep(tmp_path / "bad", "x=interval(-1,1)", "hydra.sweeper.repeats=2", nproc=1)
    assert res.returncode != 0 and "needs hydra.sweeper.seed_key" in res.output
