"""Promotion ASHA (issue 41) across real torchrun ranks: ``tests/apps/rung_app.py`` pauses at its rungs through
``should_preempt()`` and resumes from its checkpoint, on 2 ranks and with 2 trial groups of 2 ranks (``n_jobs=2``).
The promotion rule itself is tabled in ``tests/test_asha.py``.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import jsonl_by
from tests.torchrun_utils import run_torchrun

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(240)]

APP = "tests/apps/rung_app.py"
#: x=0.3 is the best point: with eta 3, the third configuration at rung 1 makes it the top third.
WARM = "hydra.sweeper.enqueue_trials=[{x:0.3},{x:0.9},{x:0.5}]"


def _sweep(tmp_path: Path, nproc: int, *overrides: str) -> optuna.Study:
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=30",
            WARM, *overrides]
    run_torchrun(APP, args, nproc=nproc, timeout_s=180, extra_env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()
    return optuna.load_study(study_name="rung_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")


def _runs(tmp_path: Path) -> dict[int, list[dict]]:
    """``{trial: [each rank's run record]}`` (a trial group's ranks are its ranks 0 and 1)."""
    return jsonl_by(tmp_path / "records", "runs_rank*.jsonl", "trial")


def _check_continuations(study: optuna.Study, runs: dict[int, list[dict]], n_configurations: int) -> None:
    trials = {t.number: t for t in study.get_trials()}
    assert all(len(r) == 2 and r[0] == r[1] for r in runs.values()), runs  # both ranks ran the same steps
    continued = [t for t in trials.values() if t.system_attrs.get("retry_history")]
    assert [t.system_attrs["retry_history"] for t in continued][:1] == [[0]], trials
    for t in continued:
        parent = t.system_attrs["retry_history"][-1]
        assert runs[t.number][0]["start"] == runs[parent][0]["last"] + 1 > 0, (t.number, runs)
        assert trials[parent].state == TrialState.PRUNED
    assert len({(t.system_attrs.get("retry_history") or [t.number])[0] for t in trials.values()}) == n_configurations


def test_asha_pauses_and_resumes_a_trial_at_the_step_it_paused_on_two_ranks(tmp_path):
    study = _sweep(tmp_path, 2, "hydra.sweeper.n_trials=4")
    _check_continuations(study, _runs(tmp_path), 4)


def test_asha_with_two_trial_groups_resumes_the_promoted_trial_in_whichever_group_is_free(tmp_path):
    study = _sweep(tmp_path, 4, "hydra.sweeper.n_trials=5", "hydra.sweeper.n_jobs=2")
    _check_continuations(study, _runs(tmp_path), 5)
    assert {t.user_attrs.get("ds_optuna:trial_group") for t in study.get_trials()} == {0, 1}
