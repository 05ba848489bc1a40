"""Hugging Face Trainer + DeepSpeed glue for one trial of a sweep, on every rank of a torchrun world.

A trial's task function builds everything from its composed config, in this order::

    with trial_scope() as scope:
        args = build_training_arguments(cfg, output_dir)   # DeepSpeed dict, then set_seed(training.seed)
        model = AutoModel...from_pretrained(...)            # after the arguments: see below
        trainer = scope.track(Trainer(model=model, args=args, ...))
        trainer.train()
    # here: engine destroyed, ZeRO-3 holders cleared, accelerate/transformers globals reset, memory trimmed

Why this order:

- **Arguments before the model.** ``TrainingArguments(deepspeed=...)`` registers the DeepSpeed config in a
  transformers global that ``from_pretrained`` reads; a ZeRO-2 trial's model built before its arguments, after
  a ZeRO-3 trial, fails on every rank (``'weight' must be 2-D``, huggingface/transformers#11894).
- **Seed before the model** (case C04): :func:`build_training_arguments` ends with ``set_seed(training.seed)``,
  so the initial weights depend only on the trial's seed and are equal on every rank (the Trainer's own
  ``set_seed`` runs after the model exists).
- **One DeepSpeed dict from the same nodes as the arguments** (cases C02, C03; :func:`deepspeed_config`), so
  the engine of trial *k* gets trial *k*'s values on every rank.
- **Deliberate teardown** (case C14): without it no engine is ever freed, and ZeRO-3 engines stay reachable
  from two DeepSpeed module-level holders (docs/deepspeed-cpu.md, "Several trials in one world").

Decisions, with their costs:

- **No JIT-built DeepSpeed ops on CPU**
  (docs/deepspeed-cpu.md, "DeepSpeed compiles C++ ops when it first needs them"). The ``deepspeed_shm_comm`` op
  (35-50 s with g++ on a machine's first run; every rank fails without a compiler) only speeds up CPU all-reduce
  within a node: by default it is reported unavailable, so collectives go through gloo (``allow_shm_build=True``
  keeps DeepSpeed's behaviour). On CPU the DeepSpeed optimizer gets ``torch_adam: true`` instead of FusedAdam
  (a ~100 s JIT build) or cpu_adam (~115 s).
- **Warmup and the schedule come from the Trainer, not from DeepSpeed.** A DeepSpeed ``scheduler`` section
  needs step counts that exist only once the dataloader is built (transformers fills them from ``"auto"``,
  which :func:`deepspeed_config` refuses). With an ``optimizer`` section and no ``scheduler`` section, the
  Trainer wraps its own scheduler (``lr_scheduler_type``, ``warmup_steps``; a float below 1 is a ratio) around
  DeepSpeed's optimizer, a combination transformers supports ("HF scheduler + DS optimizer").

This module re-exports what the package root serves lazily from ``_hf_args.py`` (the arguments, which use
``_hf_teardown.py``'s process patches) and ``_hf_teardown.py`` (the trial scope); the pruning callback is
``_hf_pruning.py``. torch, transformers, accelerate and DeepSpeed are imported inside functions only.
"""

from __future__ import annotations

from ._hf_args import build_training_arguments, deepspeed_config, world_size
from ._hf_teardown import TrialScope, live_deepspeed_engines, teardown_trial, trial_scope

__all__ = [
    "TrialScope",
    "build_training_arguments",
    "deepspeed_config",
    "live_deepspeed_engines",
    "teardown_trial",
    "trial_scope",
    "world_size",
]
