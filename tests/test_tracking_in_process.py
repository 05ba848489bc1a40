"""Issue 25, what rank 0 alone decides about tracking, in process at world size 1 (``tests/in_process.py``; the
2-rank tracking contract is ``tests/multirank/test_tracking.py``): a resumed sweep adds its trials' runs under the
study's one parent run, none duplicated; a tracking server that cannot be reached changes nothing in the study."""

from __future__ import annotations

import json
from pathlib import Path

from tests.in_process import sweep
from tests.multirank.sweep_helpers import load
from tests.multirank.test_tracking import _child_runs


def test_a_tracking_server_that_cannot_be_reached_changes_nothing_in_the_study(tmp_path: Path) -> None:
    r = sweep(tmp_path, "x=interval(0,1)", "steps=2", "hydra.sweeper.n_trials=3",
              "hydra.sweeper.tracking.report_to=[mlflow]", "hydra.sweeper.tracking.mlflow.tracking_uri=http://127.0.0.1:9")
    r.check()
    study = load(tmp_path)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert all(len(t.intermediate_values) == 2 for t in study.trials)
    assert r.output.count("Tracking: mlflow could not be opened") == 1, r.output[-3000:]
    results = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert "best_trial" in results
    rec = json.loads((tmp_path / "records" / "trial0_rank0.json").read_text())
    assert not any(k.startswith("MLFLOW_") for k in rec["tracking_env"])  # the task is not sent to a dead server


def test_the_same_command_resumed_adds_runs_under_the_same_parent_none_duplicated(tmp_path: Path) -> None:
    tracked = ["x=interval(0,1)", "steps=2", "hydra.sweeper.tracking.report_to=[mlflow]"]
    sweep(tmp_path, *tracked, "hydra.sweeper.n_trials=2").check()
    uri = f"sqlite:///{tmp_path / 'sweep'}/mlflow.db"
    _, first = _child_runs(uri)  # asserts one parent run, every trial's run under it, one run per trial
    assert sorted(first) == [0, 1]
    sweep(tmp_path, *tracked, "hydra.sweeper.n_trials=4").check()
    refits, runs = _child_runs(uri)
    assert sorted(runs) == [0, 1, 2, 3] and refits == []
    assert all(runs[n].info.run_id == first[n].info.run_id for n in first)  # the first launch's runs, kept
    study = load(tmp_path)
    for t in study.trials:
        assert runs[t.number].data.metrics["value"] == t.value and runs[t.number].info.status == "FINISHED"
