"""Case C42: each rank's job log holds the task's own log lines, the trial's outcome and, on the rank
that failed, the traceback (the error messages send users to these per-rank logs).

One 2-rank sweep of the plain DDP app: trial 0 completes, trial 1 fails on rank 1 only, trial 2 is
pruned at step 1; then the best trial is refit.
"""

from __future__ import annotations

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.torchrun_utils import run_torchrun

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(240)]

APP = "tests/apps/ddp_plain_app.py"


def test_c42_each_ranks_job_log_has_the_task_lines_the_outcome_and_the_traceback(tmp_path):
    sweep = tmp_path / "sweep"
    run_torchrun(APP, ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=3", "fail_on_rank=1",
                       "fail_on_trial=1", "prune_on_trial=2", "hydra.sweeper.max_failure_rate=1.0",
                       "hydra.sweeper.refit.enabled=true", "hydra.sweeper.refit.overrides=['steps=2']"],
                 timeout_s=200).check()
    study = optuna.load_study(study_name="ddp_plain_app", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED]
    logs = {(n, r): (sweep / str(n) / f"ddp_plain_app_rank{r}.log").read_text() for n in range(3) for r in (0, 1)}
    for (n, rank), text in logs.items():
        assert f"task line: rank {rank}/2 starts" in text and f"task line: rank {rank} step 1 loss" in text, text
    value = study.trials[0].value
    for rank in (0, 1):
        assert f"trial 0 COMPLETE value {value:.6g} (on this rank the task returned" in logs[0, rank]
        assert "trial 1 FAIL: rank 1: RuntimeError: injected failure on rank 1" in logs[1, rank]
        assert "trial 2 PRUNED at step 1 (on this rank the task was pruned)" in logs[2, rank]
    assert "(on this rank the task returned" in logs[1, 0].split("trial 1 FAIL")[1]
    assert "Traceback (most recent call last)" not in logs[1, 0]
    failed = logs[1, 1]
    assert "rank 1/2, trial 1 failed:\nTraceback (most recent call last)" in failed
    assert failed.index("Traceback") < failed.index("trial 1 FAIL: ")
    assert 'raise RuntimeError(f"injected failure on rank {rank}")' in failed

    # The refit's job logs: what it ran (its overrides, not an empty params dict) and how it ended.
    refit = yaml.safe_load((sweep / "optimization_results.yaml").read_text())["refit"][0]
    number = refit["trial"]
    for rank in (0, 1):
        text = (sweep / "refit" / str(number) / f"ddp_plain_app_rank{rank}.log").read_text()
        assert f"rank {rank}/2 runs the refit of trial {number} with overrides [" in text and "'steps=2'" in text
        assert "params {}" not in text
        assert f"refit of trial {number} COMPLETE metrics" in text, text
