"""A user's own HF Trainer app, written as docs/tutorial/hf-deepspeed.md shows (C48).

A tiny BERT classifier built from a config (no model hub, created under ZeRO-3's partitioned init by
``from_config``), random token ids, the glue's ``build_training_arguments``, ``trial_scope`` and
``pruning_callback``; nothing of the example's own log or warning handling. Returns the last eval loss.

    torchrun --nproc_per_node 2 tests/apps/hf_user_app.py -m
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hydra_plugins.ds_optuna_sweeper import build_training_arguments, pruning_callback, run_then_exit, trial_scope


def _data(size: int, length: int, vocab_size: int, seed: int) -> list[dict]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (size, length), generator=gen)
    labels = torch.randint(0, 2, (size,), generator=gen)
    mask = torch.ones(length, dtype=torch.long)
    return [{"input_ids": ids[i], "attention_mask": mask, "labels": labels[i]} for i in range(size)]


def train(cfg: DictConfig, scope) -> float:
    from transformers import AutoModelForSequenceClassification, BertConfig, Trainer, default_data_collator

    args = build_training_arguments(cfg, HydraConfig.get().runtime.output_dir)  # before the model
    m = cfg.model
    model = AutoModelForSequenceClassification.from_config(BertConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.layers, num_attention_heads=2,
        intermediate_size=2 * m.hidden_size, max_position_embeddings=2 * cfg.data.length, num_labels=2))
    pruning = pruning_callback("eval_loss")
    trainer = scope.track(Trainer(
        model=model, args=args, data_collator=default_data_collator, callbacks=[pruning],
        train_dataset=_data(cfg.data.train_size, cfg.data.length, m.vocab_size, seed=1),
        eval_dataset=_data(cfg.data.eval_size, cfg.data.length, m.vocab_size, seed=2)))
    trainer.train()
    pruning.raise_if_pruned()
    return float(next(e["eval_loss"] for e in reversed(trainer.state.log_history) if "eval_loss" in e))


@hydra.main(config_path="conf", config_name="hf_user", version_base="1.3")
def main(cfg: DictConfig) -> float:
    with trial_scope() as scope:
        return train(cfg, scope)


if __name__ == "__main__":
    run_then_exit(main)
