"""The HF user app (``hf_user_app.py``) with a step long enough to be preempted, for the resume tests.

Each rank writes ``<DSO_RECORD_DIR>/trial<n>_rank<r>.json``: the global step its ``train()`` started at (the
checkpoint's step after a resume, else 0), the optimizer steps it ran, the returned eval loss, and for PBT the
hash of the weights it started from and last saved, the learning rate of its first step and at its last save.

    torchrun --nproc_per_node 2 tests/apps/hf_resume_app.py -m step_sleep_s=0.2
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hydra_plugins.ds_optuna_sweeper import build_training_arguments, current_trial, pruning_callback, run_then_exit, trial_scope


def _callback(sleep_s: float, stall_rank: int, stall_s: float):
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        """Records where training started and how many steps it ran; sleeps after each step. Rank
        ``stall_rank`` (-1: none), at the first step end after a checkpoint was saved, writes
        ``<DSO_RECORD_DIR>/stalled_rank<r>`` and sleeps ``stall_s`` seconds more: a test that kills it then
        knows every other rank waits in ``should_preempt()`` (this callback runs before the sweeper's), not
        inside a gloo collective that would see the dead peer first."""

        first_step: int | None = None
        ran = 0
        saved = False
        pbt: dict = {}

        def on_train_begin(self, args, state, control, **kwargs):
            self.first_step = int(state.global_step)
            self.pbt["start_sha256"] = _weights_sha256(kwargs["model"])

        def on_step_begin(self, args, state, control, **kwargs):
            if "lr_in_effect" not in self.pbt:  # after every on_train_begin (the glue's sets a PBT clone's rate)
                self.pbt["lr_in_effect"] = kwargs["optimizer"].param_groups[0]["lr"]

        def on_save(self, args, state, control, **kwargs):
            self.saved = True
            self.pbt.update(saved_sha256=_weights_sha256(kwargs["model"]),
                            lr_at_save=kwargs["optimizer"].param_groups[0]["lr"])

        def on_step_end(self, args, state, control, **kwargs):
            self.ran += 1
            time.sleep(sleep_s)
            marker = Path(os.environ.get("DSO_RECORD_DIR", "."), f"stalled_rank{stall_rank}")
            if self.saved and int(os.environ.get("RANK", "0")) == stall_rank and not marker.exists():
                marker.parent.mkdir(parents=True, exist_ok=True)  # once per sweep, not again after a restart
                marker.write_text(str(state.global_step))
                time.sleep(stall_s)

    return Steps()


def _weights_sha256(model) -> str:
    """A hash of the model's weights (whole on every rank up to ZeRO-2): a PBT clone starts from its donor's."""
    import hashlib

    digest = hashlib.sha256()
    for value in model.state_dict().values():
        digest.update(value.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def train(cfg: DictConfig, scope) -> float:
    from transformers import AutoModelForSequenceClassification, BertConfig, Trainer, default_data_collator

    from hf_user_app import _data

    args = build_training_arguments(cfg, HydraConfig.get().runtime.output_dir)  # before the model
    m = cfg.model
    model = AutoModelForSequenceClassification.from_config(BertConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.layers, num_attention_heads=2,
        intermediate_size=2 * m.hidden_size, max_position_embeddings=2 * cfg.data.length, num_labels=2))
    steps = _callback(float(cfg.step_sleep_s), int(cfg.stall_rank), float(cfg.stall_s))
    trainer = scope.track(Trainer(
        model=model, args=args, data_collator=default_data_collator, callbacks=[pruning_callback("eval_loss"), steps],
        train_dataset=_data(cfg.data.train_size, cfg.data.length, m.vocab_size, seed=1),
        eval_dataset=_data(cfg.data.eval_size, cfg.data.length, m.vocab_size, seed=2)))
    record = {"first_step": None, "ran": 0, "value": None}
    try:
        trainer.train()
        record["value"] = float(next(e["eval_loss"] for e in reversed(trainer.state.log_history) if "eval_loss" in e))
        return record["value"]
    finally:
        record.update(first_step=steps.first_step, ran=steps.ran, **steps.pbt)
        out = os.environ.get("DSO_RECORD_DIR")
        if out:
            trial = current_trial()
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, f"trial{trial.number}_rank{trial.rank}.json").write_text(json.dumps(record))


@hydra.main(config_path="conf", config_name="hf_resume", version_base="1.3")
def main(cfg: DictConfig) -> float:
    with trial_scope() as scope:
        return train(cfg, scope)


if __name__ == "__main__":
    run_then_exit(main)
