"""The sweeper under real torchrun (2 ranks, CPU, gloo) with the tiny test app: the cross-rank contracts.

One launch each: the same config and params on every rank (C01, with C08's late rank and one sweep dir, a
``custom_search_space`` param and the ``backend`` setting in the same launch), a config mismatch between ranks,
prune at the same step (C05), define-by-run values. What rank 0 alone decides (search space, grid, timeout,
resume counting, refusals, enqueued trials, seed repeats, failure rate) runs in process in
``tests/test_sweep_rules.py``; a failure on one rank agreed by every rank, and ``max_failure_rate=0`` ending
every rank non-zero, are ``tests/faults/test_faults.py``'s launches.
"""

import json

import pytest
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from tests.torchrun_utils import run_torchrun

from .sweep_helpers import load, records, run_sweep

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(240)]

LABELS = ["with space", "1", "null", "x=y,z", "it's"]


def _assert_ranks_agree(recs, numbers, nproc=2):
    for n in numbers:
        per_rank = [recs[(n, r)] for r in range(nproc)]
        assert len({r["config_hash"] for r in per_rank}) == 1, f"trial {n}: configs differ"
        assert len({r["output_dir"] for r in per_rank}) == 1, f"trial {n}: job dirs differ"
        assert all(r["trial_number"] == n for r in per_rank)
        assert all(r["trial_params"] == per_rank[0]["trial_params"] for r in per_rank)


def test_c01_one_study_one_sampler_same_config_on_every_rank(tmp_path):
    """C01: 3 trials; every rank's task gets the same config and params (a choice of ints, a float in exact
    float64, a choice of awkward strings, and ``lr`` added by a ``custom_search_space`` function on rank 0);
    rank 1 never touches the storage. In the same launch, C08: rank 1 starts 1.5 s late, so Hydra's
    ``${now:...}`` differs per rank, yet there is one sweep dir and one job dir per trial, with one
    ``.hydra/`` (rank 0's) and a job log per rank; and ``backend=cpu:gloo`` builds every rank's training
    group, which the task's all_reduce uses in every trial."""
    spy, cwd, rec = tmp_path / "spy", tmp_path / "cwd", tmp_path / "records"
    cwd.mkdir()
    label = "label=choice('with space','1','null','x=y,z','it\\'s')"  # the same strings as LABELS
    res = run_torchrun(
        "tests/apps/sweep_app.py",
        ["-m", "hydra.sweep.dir=multirun/${now:%Y-%m-%d_%H-%M-%S}", "hydra.sweeper.rank_timeout=30",
         "hydra.sweeper.plots=false", "hydra.sweeper.n_trials=3", "model.hidden=choice(16,32,64)", "x=interval(-1,1)",
         label, "hydra.sweeper.custom_search_space=search_space_fns.suggest_lr", "collectives=2",
         "hydra.sweeper.backend=cpu:gloo"],
        cwd=cwd, timeout_s=150,
        extra_env={"DSO_SPY_DIR": str(spy), "DSO_DELAY_RANK": "1", "DSO_DELAY_S": "1.5", "DSO_RECORD_DIR": str(rec)},
    ).check()
    # C08: one sweep dir although the ranks resolved ${now:...} at different times.
    sweep_dirs = list((cwd / "multirun").iterdir())
    assert len(sweep_dirs) == 1, sweep_dirs
    sweep = sweep_dirs[0]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name != "plots") == ["0", "1", "2"]
    for n in range(3):
        job = sweep / str(n)
        # One .hydra/ per job, written by rank 0 alone (its per-rank log name is in hydra.yaml).
        hydra_yaml = (job / ".hydra" / "hydra.yaml").read_text()
        assert "_rank0.log" in hydra_yaml and "_rank1.log" not in hydra_yaml
        assert sorted(p.name for p in job.glob("*.log")) == ["sweep_app_rank0.log", "sweep_app_rank1.log"]

    study = load(tmp_path, sweep_dir=sweep)
    assert len(study.trials) == 3
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    recs = records(tmp_path)
    assert sorted(recs) == [(n, r) for n in range(3) for r in range(2)]
    _assert_ranks_agree(recs, range(3))
    assert {r["output_dir"] for r in recs.values()} == {str(sweep / str(n)) for n in range(3)}
    for t in study.trials:
        assert set(t.params) == {"model.hidden", "x", "label", "lr"}
        assert t.distributions["lr"] == FloatDistribution(1e-4, 1e-2, log=True)
        assert t.user_attrs["fn_rank"] == "0" and t.user_attrs["fn_saw_params"] == {
            k: t.params[k] for k in ("model.hidden", "x", "label")}  # on rank 0, after sampling
        for r in range(2):
            cfg = recs[(t.number, r)]["config"]
            assert cfg["model"]["hidden"] == t.params["model.hidden"]
            assert cfg["x"] == t.params["x"] and cfg["lr"] == t.params["lr"]  # exact float64 on every rank
            assert cfg["label"] == t.params["label"] and recs[(t.number, r)]["types"]["label"] == "str"
            assert t.values[0] == cfg["x"] ** 2 + cfg["y"]
    assert {t.params["label"] for t in study.trials} <= set(LABELS)
    # Rank 0 alone opened the storage and the study and asked it (these are also the spy's positive
    # controls); rank 1 touched none of the storage's entry points the spy wraps (tests/apps/sweep_app.py:
    # any storage class built, get_storage, fail_stale_trials, a Study built, create/load_study, ask).
    assert (spy / "ask_rank0.txt").read_text().count("x") == 3
    for label_ in ("create_study", "Study.__init__", "RDBStorage.__init__", "fail_stale_trials"):
        assert (spy / f"{label_}_rank0.txt").exists(), (label_, sorted(p.name for p in spy.iterdir()))
    assert sorted(p.name for p in spy.iterdir() if "rank1" in p.name) == []
    results = OmegaConf.load(sweep / "optimization_results.yaml")
    assert results.best_trial == study.best_trial.number
    assert results.best_value == study.best_value
    assert res.output.count("Search space:") == 1
    assert "runs at world size 1" not in res.output  # started by torchrun: no notice (tests/test_world_size_one_notice.py)
    # backend: the setting (the CPU default is plain gloo) built each rank's training group.
    for r in range(2):
        assert f"rank {r}/2 (local rank {r}), training backend cpu:gloo, control plane gloo" in res.output


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


def test_c05_pruning_decided_on_rank0_stops_every_rank_at_the_same_step(tmp_path):
    run_sweep(
        tmp_path, "hydra.sweeper.n_trials=5", "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=2",
        "hydra.sweeper.pruner.n_warmup_steps=1", "steps=4", "x=interval(-1,1)", "hydra/sweeper/sampler=random",
    ).check()
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert states[:2] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert states[2:] == [TrialState.PRUNED] * 3
    for t in study.trials[2:]:
        steps = [json.loads((tmp_path / "records" / f"pruned_trial{t.number}_rank{r}.json").read_text())["step"]
                 for r in range(2)]
        assert steps == [1, 1]  # first step after the warm-up, on both ranks
        assert t.intermediate_values == {0: 10.0 * t.number + t.params["x"] ** 2, 1: 10.0 * t.number + t.params["x"] ** 2 - 0.1}


def test_define_by_run_values_are_identical_on_every_rank_and_stored(tmp_path):
    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "suggest=true", "x=interval(-1,1)").check()
    study = load(tmp_path)
    for t in study.trials:
        per_rank = [json.loads((tmp_path / "records" / f"suggest_trial{t.number}_rank{r}.json").read_text()) for r in range(2)]
        assert per_rank[0] == per_rank[1]
        assert per_rank[0] == {k: repr(t.params[k]) for k in ("s_float", "s_int", "s_cat")}  # exact float64 repr
        assert t.state == TrialState.COMPLETE
