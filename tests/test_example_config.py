"""The example app's sweep config stays in step with its training defaults and with TrainingArguments'."""

import dataclasses
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.torchrun_utils import REPO


def _compose():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="train", return_hydra_config=True)


def test_the_hand_picked_baseline_is_the_config_as_composed():
    """The refit's ``hand_picked_default`` baseline sets nothing: it is conf/training/default.yaml, whose
    searched values lie inside the search space; the search has no warm start (issue 26)."""
    cfg = _compose()
    assert dict(cfg.hydra.sweeper.refit.baselines.hand_picked_default) == {}
    assert not cfg.hydra.sweeper.enqueue_trials
    assert cfg.training.learning_rate == 3e-4 and cfg.training.warmup_steps == 0.1 and cfg.training.weight_decay == 0.01
    assert cfg.hydra.sweeper.direction == "maximize"


def test_second_baseline_is_training_arguments_own_defaults():
    """The ``trainingarguments_defaults`` baseline is what ``TrainingArguments`` would use with nothing set: the
    searched keys as given, the fixed ones (micro batch, accumulation, schedule, Adam, clipping) from
    conf/training/default.yaml."""
    from transformers import TrainingArguments

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    cfg = _compose()
    baseline = cfg.hydra.sweeper.refit.baselines.trainingarguments_defaults
    assert set(baseline) == set(cfg.hydra.sweeper.params)
    for key, value in baseline.items():
        assert value == defaults[key.split(".", 1)[1]], key
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "lr_scheduler_type", "adam_beta1",
                 "adam_beta2", "adam_epsilon", "max_grad_norm"):
        if f"training.{name}" not in baseline:
            assert cfg.training[name] == defaults[name], name


def test_every_refit_override_composes_and_changes_the_search_config():
    """Each ``hydra.sweeper.refit.overrides`` entry of conf/train.yaml composes against the task config
    (Hydra's compose API), sets a key the config has to the value given, and that value differs from the
    search's (else the refit would only rerun the search config); ``refit.trials`` names only what the
    README allows: ``best``, ``enqueued`` or trial numbers."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = _compose()
    overrides = list(cfg.hydra.sweeper.refit.overrides)
    assert overrides, "conf/train.yaml's refit changes nothing"
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        refit = compose(config_name="train", overrides=overrides)
    missing = object()
    for text in overrides:
        override = OverridesParser.create().parse_override(text)
        key, value = override.key_or_group, override.value()
        assert OmegaConf.select(cfg, key, default=missing) is not missing, f"{text}: no key {key} in the task config"
        assert OmegaConf.select(refit, key) == value, text
        assert OmegaConf.select(cfg, key) != value, f"{text}: the search config already has it"
    for entry in cfg.hydra.sweeper.refit.trials:
        assert entry in ("best", "enqueued") or isinstance(entry, int), entry


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


#: The repo's apps whose config the sweeper's sampler and pruner groups must compose with (case C38).
APP_CONFIGS = ("train", "ddp_mlp", "lightning_mlp", "lora")


def _sweeper_node(config: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name=config, overrides=overrides, return_hydra_config=True).hydra.sweeper


def test_c38_every_sampler_and_pruner_option_composes_with_each_app_and_passes_the_sweepers_checks():
    """``examples/train.py -m hydra/sweeper/sampler=random`` failed to compose: conf/train.yaml set the TPE-only
    key ``n_startup_trials`` under ``hydra.sweeper.sampler`` (and median-only keys under ``pruner``, so
    ``hydra/sweeper/pruner=nop`` failed too). Every option of both groups, with every app config, composes
    to that option's class, and the sweeper's settings check (keys the class takes, case C26) accepts it."""
    from hydra_plugins.ds_optuna_sweeper._settings import Settings
    from hydra_plugins.ds_optuna_sweeper.config import PRUNERS, SAMPLERS

    for config in APP_CONFIGS:
        for group, options in (("sampler", SAMPLERS), ("pruner", PRUNERS)):
            for option, schema in options.items():
                node = _sweeper_node(config, [f"hydra/sweeper/{group}={option}"])
                assert node[group]._target_ == schema._target_, (config, option)
                Settings.from_node({k: node[k] for k in node}, world_size=2)


def test_c38_the_apps_keep_their_own_sampler_and_pruner_settings_by_default():
    """The settings moved into group options of conf/hydra/sweeper/ are still what a plain ``-m`` run gets
    (the demo's TPE after 4 trials, the median pruner from step 400, 0.4 epoch, after 3 trials), a key
    override still reaches them, and choosing another option drops them."""
    train = _sweeper_node("train", [])
    assert train.sampler._target_ == "optuna.samplers.TPESampler" and train.sampler.n_startup_trials == 4
    assert train.pruner._target_ == "optuna.pruners.MedianPruner"
    assert (train.pruner.n_startup_trials, train.pruner.n_warmup_steps) == (3, 400)
    for config in ("ddp_mlp", "lightning_mlp"):
        node = _sweeper_node(config, [])
        assert (node.sampler._target_, node.sampler.seed, node.sampler.n_startup_trials) == (
            "optuna.samplers.TPESampler", 0, 4), config
        assert node.pruner._target_ == "optuna.pruners.MedianPruner" and node.pruner.n_startup_trials == 5, config
        assert _sweeper_node(config, ["hydra/sweeper/sampler=random"]).sampler.seed == 0, config  # the app's seed
    assert _sweeper_node("train", ["hydra.sweeper.sampler.n_startup_trials=7"]).sampler.n_startup_trials == 7
    assert _sweeper_node("train", ["hydra/sweeper/pruner=median"]).pruner.n_warmup_steps == 0  # Optuna's default


def test_the_demos_trial_line_names_one_length_once():
    """demo.md said "PRUNED 1 (15-15 s each)": one trial, or trials of one length, get one figure."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo", REPO / "examples" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert (demo._span(15, 15), demo._span(29, 35)) == ("15", "29-35")
