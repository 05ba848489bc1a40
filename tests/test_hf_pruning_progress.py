"""C40: the HF pruning callback compares trials at the same training progress, whatever their gradient
accumulation or micro batch, and reports each progress point once.

A real ``transformers.Trainer`` (world size 1, CPU, no DeepSpeed) trains a tiny BERT classifier built from
a config (no model hub) on 64 random sequences, inside a real trial of an in-memory Optuna study held in
the sweeper's trial slot. Each trial evaluates at every quarter of its optimizer steps
(``eval_steps=0.25``), so trials with accumulation 1 and 2 evaluate after the same micro batches but at
different optimizer steps.
"""

from __future__ import annotations

import re
import warnings

import pytest

N_SAMPLES, MICRO = 64, 4  # 16 micro batches per epoch


@pytest.fixture(autouse=True)
def _no_world(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def _dataset() -> list[dict]:
    import torch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 32, (N_SAMPLES, 8), generator=gen)
    labels = torch.randint(0, 2, (N_SAMPLES,), generator=gen)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(8, dtype=torch.long), "labels": labels[i]}
            for i in range(N_SAMPLES)]


def _model():
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=2)
    return BertForSequenceClassification(config)


def _sweep_trial(study):
    """A live trial of ``study`` as the sweeper's slot holds it in a single process (world size 1)."""
    from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm
    from hydra_plugins.ds_optuna_sweeper._task._handle import RankTrial

    optuna_trial = study.ask()
    return RankTrial(optuna_trial.number, {}, RankComm(), optuna_trial)


def run_trial(study, tmp_path, *, accumulation: int, micro: int = MICRO, evaluate_after: bool = False,
              **callback_kwargs):
    """Train one trial of ``study`` with the pruning callback; returns (stored trial, callback, warnings)."""
    from transformers import Trainer, TrainingArguments, default_data_collator

    from hydra_plugins.ds_optuna_sweeper import pruning_callback, trial_scope
    from hydra_plugins.ds_optuna_sweeper._task._slot import trial_slot

    trial = _sweep_trial(study)
    callback = pruning_callback("eval_loss", **callback_kwargs)
    data = _dataset()
    with warnings.catch_warnings(record=True) as caught, trial_slot(trial), trial_scope() as scope:
        warnings.simplefilter("always")
        args = TrainingArguments(
            output_dir=str(tmp_path / f"trial{trial.number}"), use_cpu=True, report_to="none", save_strategy="no",
            per_device_train_batch_size=micro, per_device_eval_batch_size=16, gradient_accumulation_steps=accumulation,
            num_train_epochs=1, eval_strategy="steps", eval_steps=0.25, logging_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0, seed=0, learning_rate=1e-3)
        trainer = scope.track(Trainer(model=_model(), args=args, train_dataset=data, eval_dataset=data[:16],
                                      data_collator=default_data_collator, callbacks=[callback]))
        trainer.train()
        if evaluate_after:
            trainer.evaluate()  # at the step of training's last evaluation
        del trainer
    study.tell(trial.number, 1.0)
    return study.trials[trial.number], callback, [str(w.message) for w in caught]


def test_trials_with_accumulation_1_and_2_report_at_the_same_steps(tmp_path):
    """The default step: thousandths of an epoch. Accumulation 1 evaluates at optimizer steps 4, 8, 12, 16,
    accumulation 2 at 2, 4, 6, 8 and a micro batch of 8 at 2, 4, 6, 8: all after 4, 8, 12, 16 micro batches
    of 4 samples, a quarter of an epoch apart."""
    import optuna

    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    one, _, _ = run_trial(study, tmp_path, accumulation=1)
    two, _, _ = run_trial(study, tmp_path, accumulation=2)
    big, _, _ = run_trial(study, tmp_path, accumulation=1, micro=2 * MICRO)
    assert one.user_attrs["optimizer_steps"] == 16 and two.user_attrs["optimizer_steps"] == 8  # the premise
    assert sorted(two.intermediate_values) == sorted(one.intermediate_values)
    assert sorted(big.intermediate_values) == sorted(one.intermediate_values)
    assert sorted(one.intermediate_values) == [250, 500, 750, 1000]


@pytest.mark.parametrize("step, expected", [("samples", [16, 32, 48, 64]), ("global_step", None)])
def test_the_step_argument_chooses_the_measure(tmp_path, step, expected):
    """``samples``: samples seen, equal across accumulation; ``global_step``: the optimizer step, which
    differs (the former behaviour, kept as a choice)."""
    import optuna

    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    one, _, _ = run_trial(study, tmp_path, accumulation=1, step=step)
    two, _, _ = run_trial(study, tmp_path, accumulation=2, step=step)
    if expected is not None:
        assert sorted(one.intermediate_values) == sorted(two.intermediate_values) == expected
    else:
        assert (sorted(one.intermediate_values), sorted(two.intermediate_values)) == ([4, 8, 12, 16], [2, 4, 6, 8])


def test_evaluate_after_train_is_not_reported_twice(tmp_path):
    """``trainer.evaluate()`` after ``train()`` evaluates at the last training step again: no second report,
    so no Optuna "already reported" warning, and the stored values are those of training."""
    import optuna

    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    stored, callback, caught = run_trial(study, tmp_path, accumulation=2, evaluate_after=True)
    assert not [m for m in caught if "already reported" in m], caught
    assert callback.reported_steps == [250, 500, 750, 1000]
    assert sorted(stored.intermediate_values) == [250, 500, 750, 1000]


def test_evaluations_closer_than_the_epoch_resolution_warn_and_report_once():
    """Two evaluations 1/10,000 epoch apart fall on the same thousandth: the second is not reported and a
    warning names ``step='samples'``."""
    import optuna
    from transformers import TrainerControl, TrainerState

    from hydra_plugins.ds_optuna_sweeper import pruning_callback
    from hydra_plugins.ds_optuna_sweeper._task._slot import trial_slot

    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.NopPruner())
    callback = pruning_callback("eval_loss")
    trial = _sweep_trial(study)
    with trial_slot(trial):
        for global_step, epoch in ((1, 0.0001), (2, 0.0002)):
            state = TrainerState()
            state.global_step, state.epoch = global_step, epoch
            if global_step == 1:
                callback.on_evaluate(None, state, TrainerControl(), metrics={"eval_loss": 0.5})
            else:
                with pytest.warns(UserWarning, match=re.escape("use pruning_callback(..., step='samples')")):
                    callback.on_evaluate(None, state, TrainerControl(), metrics={"eval_loss": 0.4})
    assert study.trials[trial.number].intermediate_values == {0: 0.5}


def test_an_unknown_step_is_refused():
    from hydra_plugins.ds_optuna_sweeper import pruning_callback

    with pytest.raises(ValueError, match="step='epochs': choose one of epoch, samples, global_step"):
        pruning_callback("eval_loss", step="epochs")
