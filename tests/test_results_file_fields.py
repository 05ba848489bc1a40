"""Case C49 (b, c), smaller frictions a new user met: a results file whose fields each mean one thing, and a
per-trial table on disk (``trials.csv``) without pandas. Rank 0 alone writes both: in process at world size 1
(``tests/in_process.py``). C49 (a), one run dir for every rank of a pasted rerun line:
``tests/multirank/test_refit.py``."""

from __future__ import annotations

import csv

import optuna
import pytest
import yaml

from tests.in_process import sweep
from tests.multirank.sweep_helpers import load


@pytest.mark.timeout(120)
def test_c49_b_c_results_name_the_stored_trials_and_the_budget_and_trials_csv_has_one_row_per_trial(tmp_path):
    from hydra_plugins.ds_optuna_sweeper._study._results import trials_in_study

    sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "label=choice(a,b)", "fail_on_rank=0",
          "fail_on_trial=1", "hydra.sweeper.max_failure_rate=1.0").check()
    sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "label=choice(a,b)").check()  # a resume: budget 4
    study = load(tmp_path)
    results = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert "n_trials" not in results  # it meant the stored trials, not hydra.sweeper.n_trials
    assert results["trials_in_study"] == len(study.trials) == 4 and results["n_trials_budget"] == 4
    assert trials_in_study(results) == 4 and trials_in_study({"n_trials": 7}) == 7  # files written before C49

    with open(tmp_path / "sweep" / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:5] == ["number", "value", "datetime_start", "datetime_complete", "duration_s"]
    assert list(rows[0])[-1] == "state"
    assert [int(r["number"]) for r in rows] == [t.number for t in study.trials]
    for row, t in zip(rows, study.trials):
        assert row["state"] == t.state.name
        assert row["value"] == (repr(t.value) if t.value is not None else "")
        assert float(row["params_x"]) == t.params["x"] and row["params_label"] == t.params["label"]
        assert float(row["duration_s"]) == pytest.approx(t.duration.total_seconds(), abs=1e-3)
    assert not [k for k in rows[0] if "ds_optuna:" in k]  # the sweeper's own attributes stay out
    assert optuna.trial.TrialState.FAIL.name in {r["state"] for r in rows}
