"""The example app's sweep config stays in step with its training defaults and with TrainingArguments'."""

import dataclasses
from pathlib import Path

from hydra import compose, initialize_config_dir

from tests.torchrun_utils import REPO


def _compose():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="train", return_hydra_config=True)


def test_enqueued_default_trial_is_the_default_config():
    cfg = _compose()
    queued = cfg.hydra.sweeper.enqueue_trials[0]
    for key, value in queued.items():
        section, name = key.split(".", 1)
        assert cfg[section][name] == value, key
    assert set(queued) == set(cfg.hydra.sweeper.params)
    assert cfg.hydra.sweeper.direction == "maximize"


def test_second_warm_start_is_training_arguments_own_defaults():
    """Trial 1 is what ``TrainingArguments`` would use with nothing set: the searched keys as enqueued, the
    fixed ones (micro batch, accumulation, schedule, Adam, clipping) from conf/training/default.yaml."""
    from transformers import TrainingArguments

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    cfg = _compose()
    queued = cfg.hydra.sweeper.enqueue_trials[1]
    assert set(queued) == set(cfg.hydra.sweeper.params)
    for key, value in queued.items():
        assert value == defaults[key.split(".", 1)[1]], key
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "lr_scheduler_type", "adam_beta1",
                 "adam_beta2", "adam_epsilon", "max_grad_norm"):
        if f"training.{name}" not in queued:
            assert cfg.training[name] == defaults[name], name


def test_refit_retrains_on_the_final_stage():
    refit = _compose().hydra.sweeper.refit
    assert list(refit.overrides) == ["data.stage=final"]
    assert list(refit.trials) == ["best", "enqueued"]


def test_the_benchmarks_overrides_compose_with_the_apps_they_run():
    """Every override list a benchmark passes composes with the app's config (conf/train.yaml sets
    median-pruner keys, so ``hydra/sweeper/pruner=nop`` stopped composing and broke three benchmarks)."""
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    try:
        import pruning
        import vs_transformers
        from _common import NO_PRUNING
    finally:
        sys.path.remove(str(REPO / "bench"))
    runs = [("train", [*NO_PRUNING, *vs_transformers.SMALL])]
    for _, (script, _, extra) in pruning.JOBS.items():
        config = Path(script).stem
        runs += [(config, [*extra, *overrides]) for overrides in pruning.PRUNERS.values()]
    for config, overrides in runs:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(config_name=config, overrides=overrides, return_hydra_config=True)
        assert cfg.hydra.sweeper.pruner._target_ == "optuna.pruners.MedianPruner", (config, overrides)
