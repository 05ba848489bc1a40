"""The plain PyTorch DDP example under the sweeper: pruning stops both ranks at the same epoch."""

import re

import optuna
import pytest
from optuna.trial import TrialState

from tests.torchrun_utils import run_torchrun

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]


def test_ddp_mlp_sweep_prunes_on_every_rank_at_the_same_epoch(tmp_path):
    sweep = tmp_path / "sweep"
    run_torchrun("examples/ddp_mlp.py", ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=12",
                                         "hydra.sweeper.plots=false"], timeout_s=240).check()
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep}/optuna.db")
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert len(study.trials) == 12 and pruned
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    for t in pruned:
        epochs = []
        for rank in (0, 1):
            text = (sweep / str(t.number) / f"ddp_mlp_rank{rank}.log").read_text()
            epochs.append(re.findall(rf"trial {t.number} pruned at epoch (\d+)", text))
        assert epochs[0] == epochs[1] and len(epochs[0]) == 1
        # The last reported step is the epoch of the verdict, and widths were suggested inside the task.
        assert max(t.intermediate_values) == int(epochs[0][0])
        assert {f"n_units_l{i}" for i in range(t.params["model.n_layers"])} <= set(t.params)
