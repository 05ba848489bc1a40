"""The Lightning glue in one process (no torchrun): what ``lightning_trial_scope`` puts back after a
real ``Trainer.fit``, what it releases, and the pruning callback outside a sweep.

Each property has a control that shows what ``fit`` leaves behind without the scope, so the test
can fail.
"""

import gc
import importlib.util
import os
import random
import re
import subprocess
import sys
from pathlib import Path
import weakref

import numpy as np
import pytest
import torch

if importlib.util.find_spec("lightning") is None:
    pytest.skip("lightning is not installed (the [lightning] extra)", allow_module_level=True)
REPO = Path(__file__).resolve().parents[1]

from hydra_plugins.ds_optuna_sweeper import lightning_pruning_callback, lightning_trial_scope  # noqa: E402


def _process_state():
    return {
        "env": {k: os.environ.get(k) for k in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG")},
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "torch_rng": torch.random.get_rng_state().clone(),
        "numpy_rng": np.random.get_state()[1].copy(),
        "python_rng": random.getstate(),
    }


def _same(a, b):
    return (a["env"] == b["env"] and a["deterministic"] == b["deterministic"]
            and torch.equal(a["torch_rng"], b["torch_rng"]) and np.array_equal(a["numpy_rng"], b["numpy_rng"])
            and a["python_rng"] == b["python_rng"])


@pytest.fixture
def lt():
    """``tests/lightning_tiny.py``: ``Tiny``, ``NeverRight``, ``fit(tmp_path, model, **trainer_kwargs)``, ``pl``."""
    from tests import lightning_tiny

    return lightning_tiny


@pytest.fixture
def clean_process_state():
    saved = dict(os.environ), torch.are_deterministic_algorithms_enabled()
    yield
    os.environ.clear()
    os.environ.update(saved[0])
    torch.use_deterministic_algorithms(saved[1])


def test_fit_changes_process_state_and_the_scope_puts_it_back(lt, tmp_path, clean_process_state):
    before = _process_state()
    lt.fit(tmp_path, lt.Tiny())  # control: without the scope the seed, env and flags of the trial stay
    after_bare = _process_state()
    assert after_bare["env"]["PL_GLOBAL_SEED"] == "123" and after_bare["deterministic"]
    assert not _same(before, after_bare)

    torch.use_deterministic_algorithms(False)
    for key in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG"):
        os.environ.pop(key, None)
    before = _process_state()
    with lightning_trial_scope() as scope:
        scope.track(lt.pl.Trainer(accelerator="cpu", devices=1, logger=False))  # a second Trainer in the scope...
        with pytest.raises(RuntimeError, match="already tracks a Trainer"):
            scope.track(lt.pl.Trainer(accelerator="cpu", devices=1, logger=False))
    with lightning_trial_scope():
        lt.fit(tmp_path, lt.Tiny())
    assert _same(before, _process_state())


def test_the_scope_releases_the_model_while_the_trainer_is_still_referenced(lt, tmp_path):
    model = lt.Tiny()
    ref = weakref.ref(model)
    trainer = lt.fit(tmp_path, model)  # control: a Trainer kept by the caller keeps its model alive
    del model
    gc.collect()
    assert ref() is not None
    del trainer
    gc.collect()

    model = lt.Tiny()
    ref = weakref.ref(model)
    with lightning_trial_scope() as scope:
        trainer = scope.track(lt.fit(tmp_path, model))
        del model
    assert trainer is not None and ref() is None, "the scope left the model reachable from the Trainer"


@pytest.mark.parametrize(("scoped", "expected"), [(True, 1), (False, 3)])
def test_lightnings_repeated_lines_and_warnings_are_shown_once_in_the_scope(tmp_path, scoped, expected):
    # A fresh process: what is shown once is kept per process. Unscoped is the control. Between fits
    # warnings.filters changes (as the sweeper's catch_warnings around study.ask does), which resets
    # Python's own "once" bookkeeping.
    code = (
        "import sys, contextlib, warnings\n"
        "sys.path.insert(0, 'tests')\n"
        "from lightning_tiny import Tiny, fit as _fit\n"
        "from hydra_plugins.ds_optuna_sweeper import lightning_trial_scope\n"
        "for _ in range(3):\n"
        f"    with (lightning_trial_scope() if {scoped} else contextlib.nullcontext()):\n"
        f"        _fit({str(tmp_path)!r}, Tiny())\n"
        "    with warnings.catch_warnings():\n"
        "        warnings.filterwarnings('ignore', message='unrelated')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert out.count("GPU available: False") == expected, out[-2000:]
    assert out.count("Tip: For seamless cloud logging") == expected
    # Warnings raised from Lightning's own files (which ones depends on the versions installed).
    raised = [line for line in out.splitlines() if re.match(r".*/lightning/[\w/]+\.py:\d+: ", line)]
    assert raised, "no warning from Lightning's files in 3 fits: pick another one for this test"
    assert {raised.count(line) for line in raised} == {expected}, raised


def test_pruning_callback_outside_a_sweep_does_nothing_and_checks_its_arguments(lt, tmp_path):
    with pytest.raises(ValueError, match="choose one of epoch, global_step"):
        lightning_pruning_callback(step="batch")
    callback = lightning_pruning_callback(monitor="val_acc")
    with lightning_trial_scope():
        trainer = lt.fit(tmp_path, lt.Tiny(), callbacks=[callback])
    assert callback.pruned_at is None and callback.stopped_global_step == trainer.global_step == 4
    callback.raise_if_pruned()  # no verdict, no exception


# --- the pruning callback in a sweep's trial and in a replayed one (refit, rerun line) -------------


def _sweep_trial(study):
    """A live trial of ``study`` as the sweeper's slot holds it in a single process (world size 1)."""
    from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm
    from hydra_plugins.ds_optuna_sweeper._task._handle import RankTrial

    optuna_trial = study.ask()
    return RankTrial(optuna_trial.number, {}, RankComm(), optuna_trial)


def _pruning_study():
    """A study whose median pruner prunes any trial that reports 0.0 at epoch 0, once one finished
    trial reported 1.0 there."""
    import optuna

    study = optuna.create_study(direction="maximize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    study.add_trial(optuna.trial.create_trial(value=1.0, intermediate_values={0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}))
    return study


def test_pruning_callback_in_a_replayed_trial_stands_aside_whatever_is_logged(lt, tmp_path):
    """docs/how-to/lightning.md: "In a refit or a pasted rerun line it does nothing": the monitor is not
    logged under that name (the refit's metrics are named otherwise), and nothing raises."""
    from hydra_plugins.ds_optuna_sweeper._task._replayed import ReplayedTrial
    from hydra_plugins.ds_optuna_sweeper._task._slot import trial_slot

    callback = lightning_pruning_callback(monitor="val_loss")  # Tiny logs val_acc only
    with trial_slot(ReplayedTrial(1, {"lr": 0.1})), lightning_trial_scope():
        trainer = lt.fit(tmp_path, lt.NeverRight(), callbacks=[callback], max_epochs=2)
    assert "val_loss" not in trainer.callback_metrics and "val_acc" in trainer.callback_metrics
    assert callback.pruned_at is None and callback.stopped_global_step == trainer.global_step == 8
    callback.raise_if_pruned()


def test_pruning_callback_in_a_sweep_trial_raises_for_a_monitor_that_was_not_logged(lt, tmp_path):
    from hydra_plugins.ds_optuna_sweeper._task._slot import trial_slot

    callback = lightning_pruning_callback(monitor="val_loss")
    with trial_slot(_sweep_trial(_pruning_study())), lightning_trial_scope():
        with pytest.raises(KeyError, match=re.escape("pruning metric 'val_loss' was not logged; logged metrics: "
                                                     "['val_acc']")):
            lt.fit(tmp_path, lt.Tiny(), callbacks=[callback])


@pytest.mark.parametrize(("minimum", "steps_run"), [({}, 4), ({"min_epochs": 3}, 12), ({"min_steps": 10}, 10)])
def test_a_prune_verdict_stops_fit_only_once_min_epochs_or_min_steps_are_reached(lt, tmp_path, minimum, steps_run):
    """docs/how-to/lightning.md: "Lightning honours should_stop only once min_epochs/min_steps are reached ...
    or a pruned trial trains on to that minimum". 4 optimizer steps an epoch; the verdict comes at
    epoch 0; without a minimum fit stops after that epoch's 4 steps (the control); with ``min_steps`` it
    stops in the middle of an epoch, at that step."""
    import optuna

    from hydra_plugins.ds_optuna_sweeper._task._slot import STEPS_ATTR, trial_slot

    study = _pruning_study()
    callback = lightning_pruning_callback(monitor="val_acc")
    trial = _sweep_trial(study)
    with trial_slot(trial), lightning_trial_scope():
        trainer = lt.fit(tmp_path, lt.NeverRight(), callbacks=[callback], max_epochs=5, **minimum)
    assert callback.pruned_at == 0
    assert callback.stopped_global_step == trainer.global_step == steps_run
    assert study.trials[trial.number].user_attrs[STEPS_ATTR] == steps_run
    with pytest.raises(optuna.TrialPruned, match="pruned at epoch 0"):
        callback.raise_if_pruned()
