"""A study written by an earlier version is read back by this one (issue 22 item 3; ``_stored.py``).

``tests/data/study_ea58e40.db`` was written by main at ``ea58e40`` (schema version 1: no
``ds_optuna:schema_version``), from real 2-rank torchrun sweeps of ``tests/apps/sweep_app.py`` on
SQLite storage:

- study ``sweep_app``: run A, ``n_trials=4``, ``x=interval(-1,1)``, a warm start ``{x: 0.25}``,
  ``custom_search_space=search_space_fns.suggest_lr``, 3 reported steps, median pruner, trial 1
  raising on rank 0; run B resumed it to ``n_trials=6`` with ``retry_failed_trials=1``, rank 1 killed
  (``kill -9``) in trial 4 and ``--max-restarts 1``. Trials: 0 COMPLETE (the warm start), 1 FAIL,
  2-3 PRUNED, 4 FAIL (abandoned), 5 PRUNED (its retry: ``failed_trial`` 4), 6 PRUNED; ``ds_optuna:runs`` 3.
- study ``sweep_app_repeats``: ``repeats=2``, ``seed_key=seed``: 2 COMPLETE trials with ``ds_optuna:seed_values``.

Each test works on a copy (the sweeper writes to the study it opens). Real SQLite, real Optuna.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study import _stored
from hydra_plugins.ds_optuna_sweeper._study._command import RerunContext, trial_overrides
from hydra_plugins.ds_optuna_sweeper._study._results import summarize
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space
from hydra_plugins.ds_optuna_sweeper._settings import Settings
from hydra_plugins.ds_optuna_sweeper._study._abandon import own_running_trials
from hydra_plugins.ds_optuna_sweeper._study._queue import counted_trials, warm_start_runs
from hydra_plugins.ds_optuna_sweeper._study._study import open_study

DB = Path(__file__).parent / "data" / "study_ea58e40.db"
FIXED_A = ["steps=3", "label=stored", "fault.kind=raise", "fault.rank=0", "fault.trial=1", "fault.phase=before"]
ARGS = ["x=interval(-1,1)", "steps=3", "label=stored"]


@pytest.fixture
def url(tmp_path: Path) -> str:
    copy = tmp_path / "optuna.db"
    shutil.copyfile(DB, copy)
    return f"sqlite:///{copy}"


def _settings(**extra) -> Settings:
    node = {"sampler": {"_target_": "optuna.samplers.TPESampler", "seed": 1},
            "pruner": {"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 1},
            "direction": "minimize", "n_trials": 8, "rank_timeout": 30,
            "enqueue_trials": [{"x": 0.25}], **extra}
    return Settings.from_node(node, world_size=1)


def test_the_file_is_a_version_1_study_as_main_wrote_it(url):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="sweep_app", storage=url)
    assert _stored.SCHEMA_VERSION_ATTR not in study.user_attrs
    assert _stored.stored_version(study.user_attrs) == _stored.UNVERSIONED == 1
    # Every key the file holds is in the table (a key main wrote that the table forgot fails here).
    listed = {(k.level, k.kind, k.key) for k in _stored.STORED_KEYS}
    found = {("study", "user", k) for k in study.user_attrs}
    for t in study.trials:
        found |= {("trial", "user", k) for k in t.user_attrs if k.startswith("ds_optuna:")}
        found |= {("trial", "system", k) for k in t.system_attrs}
    assert found <= listed, found - listed


def test_results_and_best_trial_read_back_as_main_wrote_them(url):
    study = optuna.load_study(study_name="sweep_app", storage=url)
    space = build_search_space(None, ARGS)
    out = summarize(study, RerunContext(space), ["minimize"], budget=6)
    # What main's optimization_results.yaml said for this study (run B).
    assert out["states"] == {"COMPLETE": 1, "PRUNED": 4, "FAIL": 2} and out["trials_in_study"] == 7
    assert (out["best_trial"], out["best_value"]) == (0, -0.1375)
    assert out["best_overrides"] == [*FIXED_A, "x=0.25", f"lr={study.trials[0].params['lr']!r}"]
    # Trials asked by run B keep run B's fixed overrides (stored per trial), and lr stays an override.
    lines, task_params = trial_overrides(study.trials[4], space)
    assert lines[:4] == ["steps=3", "label=stored", "fault.kind=kill9", "fault.rank=1"] and task_params == {}
    assert lines[-1].startswith("lr=")
    # Budget: the abandoned trial 4 is replaced by its retry 5; refit's "enqueued" finds the warm start.
    assert counted_trials(study) == 6
    assert warm_start_runs(study.get_trials(deepcopy=False)) == [0]
    groups = {t.user_attrs[_stored.GROUP_ATTR] for t in study.trials}
    assert len(groups) == 2 and own_running_trials(study, groups.pop()) == []
    repeats = optuna.load_study(study_name="sweep_app_repeats", storage=url)
    for t in repeats.trials:
        per_seed = t.user_attrs[_stored.SEED_VALUES_ATTR]
        assert sorted(per_seed) == ["0", "1"] and t.value == pytest.approx(sum(v[0] for v in per_seed.values()) / 2)


def test_resuming_it_counts_the_run_queues_nothing_twice_and_marks_the_schema(url, caplog):
    caplog.set_level("INFO")
    study = open_study(_settings(), build_search_space(None, ARGS), storage_url=url, study_name="sweep_app")
    assert study.user_attrs[_stored.RUNS_ATTR] == 4
    assert study.user_attrs[_stored.SCHEMA_VERSION_ATTR] == _stored.SCHEMA_VERSION
    assert len(study.trials) == 7 and "Warm start {x: 0.25}: ran before (trial 0, COMPLETE)" in caplog.text
    trial = study.ask()  # the resumed study goes on with the stored distributions
    assert trial.number == 7 and -1 <= trial.suggest_float("x", -1, 1) <= 1
    study.tell(trial, state=TrialState.FAIL)


def test_a_study_from_a_newer_schema_is_kept_as_is_with_a_warning(url, caplog):
    study = optuna.load_study(study_name="sweep_app", storage=url)
    study.set_user_attr(_stored.SCHEMA_VERSION_ATTR, _stored.SCHEMA_VERSION + 1)
    reopened = open_study(_settings(), build_search_space(None, ARGS), storage_url=url, study_name="sweep_app")
    assert reopened.user_attrs[_stored.SCHEMA_VERSION_ATTR] == _stored.SCHEMA_VERSION + 1
    assert "written by a newer ds_optuna sweeper" in caplog.text


def test_the_stored_attributes_page_shows_the_table():
    page = (Path(__file__).parents[1] / "docs" / "reference" / "stored.md").read_text()
    assert _stored.markdown_table() in page, "docs/reference/stored.md: run python docs/gen_reference.py"
