"""The plain PyTorch DDP example under the sweeper: pruning stops both ranks at the same epoch, and the
checkpoint retention rule's default leaves the best trial's newest checkpoint only."""

import re

import optuna
import pytest
from optuna.trial import TrialState

from tests.torchrun_utils import run_torchrun

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]


@pytest.mark.soak  # the lean net's 12 min; make test keeps the example in test_two_nodes.py and PBT, retention in
# test_preemption.py, pruning on every rank in test_sweep.py
def test_ddp_mlp_sweep_prunes_on_every_rank_at_the_same_epoch_and_keeps_the_best_checkpoint_only(tmp_path):
    """8 trials of 4 epochs, a checkpoint every epoch, median pruning after 2 trials. Pruned trials stop on both
    ranks after the same epoch, the last step reported; the widths are suggested inside the task. After the sweep
    only the best COMPLETE trial's checkpoint directory is left, holding its newest checkpoint (issue 24's
    retention default); pruned trials' are gone."""
    sweep = tmp_path / "sweep"
    run_torchrun("examples/ddp_mlp.py", ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=8", "epochs=4",
                                         "save_every=1", "hydra.sweeper.pruner.n_startup_trials=2",
                                         "hydra.sweeper.plots=false"], timeout_s=240).check()
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep}/optuna.db")
    states = [t.state for t in study.trials]
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert len(study.trials) == 8 and pruned and states.count(TrialState.COMPLETE) >= 2, states
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
    left = sorted(p.name for p in (sweep / "checkpoints").iterdir())
    assert left == [f"trial{study.best_trial.number}"], (left, states)
    assert [p.name for p in (sweep / "checkpoints" / left[0]).iterdir()] == ["step=80.ckpt"]  # 4 epochs x 20 steps
