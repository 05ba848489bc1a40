"""Case C49, smaller frictions a new user met: one run dir for every rank of a rerun line, a results
file whose fields each mean one thing, and a per-trial table on disk without pandas."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from tests.multirank.sweep_helpers import load, run_sweep
from tests.torchrun_utils import base_env, run_command, run_torchrun

APP = "tests/apps/ddp_plain_app.py"
VENV_BIN = str(Path(sys.executable).parent)


@pytest.mark.torchrun
@pytest.mark.timeout(240)
def test_c49_a_rerun_line_under_torchrun_runs_every_rank_in_one_run_dir(tmp_path):
    sweep = tmp_path / "sweep"
    run_torchrun(APP, ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=1"], cwd=tmp_path,
                 timeout_s=120).check()
    line = yaml.safe_load((sweep / "optimization_results.yaml").read_text())["rerun_command"]
    assert " -m " not in line.replace(" -m torch.distributed.run ", " ") and "--nproc_per_node 2" in line, line
    # Rank 1 starts 1.5 s after rank 0, so each rank's own `${now:...}` run dir would differ.
    env = base_env(DSO_RECORD_DIR=str(tmp_path / "rerun"), DSO_DELAY_RANK="1", DSO_DELAY_S="1.5",
                   PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    run_command(["bash", "-c", line], timeout_s=120, cwd=tmp_path, env=env).check()
    dirs = [json.loads((tmp_path / "rerun" / f"trial0_rank{r}.json").read_text())["output_dir"] for r in (0, 1)]
    assert dirs[0] == dirs[1] == str(sweep / "rerun" / "0"), dirs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rerun", "sweep"]  # no outputs/<date>/<time> per rank


@pytest.mark.torchrun
@pytest.mark.timeout(200)
def test_c49_b_c_results_name_the_stored_trials_and_the_budget_and_trials_csv_has_one_row_per_trial(tmp_path):
    from hydra_plugins.ds_optuna_sweeper._study._results import trials_in_study

    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "label=choice(a,b)", "fail_on_rank=0",
              "fail_on_trial=1", "hydra.sweeper.max_failure_rate=1.0", "hydra.sweeper.plots=false", nproc=1).check()
    run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "label=choice(a,b)",
              "hydra.sweeper.plots=false", nproc=1).check()  # a resume: this run's budget is 4
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
