"""Case C39: a plain DDP task runs at world size 1 with ``python app.py -m``, the same code as under torchrun.

The task creates the default process group only when none exists (``if not dist.is_initialized():``)
and wraps its model in ``DistributedDataParallel``. Without torchrun that guarded call used ``env://``
and failed every trial ("environment variable RANK expected, but not set"); the sweeper now creates a
one-process default group and sets torchrun's variables that are unset (README, "Your task and the
process group").
"""

from __future__ import annotations

import json
import re

import optuna
import pytest
from optuna.trial import TrialState

from tests.torchrun_utils import run_python

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(200)]

APP = "tests/apps/ddp_plain_app.py"


def test_c39_a_plain_ddp_task_runs_two_trials_at_world_size_one_with_python(tmp_path):
    sweep = tmp_path / "sweep"
    run_python(APP, ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2"], timeout_s=150,
               extra_env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()
    study = optuna.load_study(study_name="ddp_plain_app", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    for t in study.trials:
        record = json.loads((tmp_path / "records" / f"trial{t.number}_rank0.json").read_text())
        # The task's own group was the sweeper's one-process gloo group, and it trained a DDP model.
        assert (record["rank"], record["world_size"], record["backend"], record["in_trial"]) == (0, 1, "gloo", True)
        assert record["loss"] == pytest.approx(t.value)


def test_c39_the_ddp_example_sweeps_at_world_size_one_with_python(tmp_path):
    sweep = tmp_path / "sweep"
    run_python("examples/ddp_mlp.py", ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "epochs=1",
                                       "hydra.sweeper.plots=false"], timeout_s=150).check()
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    for t in study.trials:
        text = (sweep / str(t.number) / "ddp_mlp.log").read_text()
        assert re.search(rf"trial {t.number}: widths .* DistributedDataParallel over 1 rank\(s\)", text), text
