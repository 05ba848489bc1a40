"""Issue 25: a tracking server that cannot be reached changes nothing in the study (rank 0 alone talks to the
trackers, so this runs in process at world size 1: ``tests/in_process.py``; the 2-rank tracking contract is
``tests/multirank/test_tracking.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.in_process import sweep
from tests.multirank.sweep_helpers import load


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
