"""The main job (MiniLM on TREC-6, HF Trainer + DeepSpeed ZeRO-2) under Ray Tune + Ray Train, for bench/vs_ray_tune.py.

Each Tune trial runs a ``TorchTrainer`` whose workers build the main job's Trainer the HF way
(``bench/hf_search_app.py``'s ``hf_parts``: conf/train.yaml composed with the trial's values, DeepSpeed values
``"auto"``) and report every evaluation (4 an epoch) to Tune from a ``TrainerCallback``. The search: conf/train.yaml's
space (lr log [5e-5, 1e-3], warmup [0, 0.2], weight decay [0, 0.1]), TPE seed 0 after 4 random trials
(``OptunaSearch``), ASHA on evaluations (grace period 2, reduction factor 2: stops a trial from half an epoch,
as the main job's median pruner does). Extra Hydra overrides (``data.train_size=128``...) follow ``--``.

    python bench/vs_ray/hf_ray_tune.py --trials 6 --workers 2 --concurrent 1 -- data.train_size=128
"""

import sys
from pathlib import Path

import ray.train
import ray.train.torch
from optuna.samplers import TPESampler
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch
from transformers import Trainer, TrainerCallback

from ray_tune import parse_args, start_ray, summarize

REPO = Path(__file__).resolve().parents[2]
EVALS = 4  # conf/training/default.yaml: eval_steps 0.25


class ReportEachEvaluation(TrainerCallback):
    """Every rank reports each evaluation's accuracy to Ray Train (a report is collective across workers)."""

    def __init__(self) -> None:
        self.evals = 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.evals += 1
        ray.train.report({"eval_accuracy": metrics["eval_accuracy"], "evals": self.evals})


def train_fn_per_worker(config: dict) -> None:
    from hf_search_app import hf_parts

    values = [f"training.{k}={config[k]}" for k in ("learning_rate", "warmup_steps", "weight_decay")]
    trainer = Trainer(**hf_parts([*config["overrides"], *values]), callbacks=[ReportEachEvaluation()])
    trainer.train()


def driver(config: dict) -> None:
    trainer = ray.train.torch.TorchTrainer(
        train_fn_per_worker,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=config["workers"], use_gpu=False),
        run_config=ray.train.RunConfig(storage_path=config["storage"], callbacks=[TuneReportCallback()],
                                       name=f"train-{tune.get_context().get_trial_id()}"),
        torch_config=ray.train.torch.TorchConfig(backend="gloo"),
    )
    trainer.fit()


def main() -> None:
    split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    overrides, sys.argv = sys.argv[split + 1:], sys.argv[:split]
    args = parse_args(trials=6)
    start_ray(args, [str(REPO / "bench"), str(REPO / "examples"), str(REPO)])
    space = {"learning_rate": tune.loguniform(5e-5, 1e-3), "warmup_steps": tune.uniform(0.0, 0.2),
             "weight_decay": tune.uniform(0.0, 0.1), "overrides": overrides, "workers": args.workers,
             "storage": args.storage}
    tuner = tune.Tuner(
        tune.with_resources(driver, {"CPU": 0.01}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="eval_accuracy", mode="max", num_samples=args.trials, max_concurrent_trials=args.concurrent,
            search_alg=OptunaSearch(sampler=TPESampler(seed=0, n_startup_trials=4)),
            scheduler=ASHAScheduler(time_attr="evals", max_t=EVALS, grace_period=2, reduction_factor=2)),
        run_config=tune.RunConfig(storage_path=args.storage, name="tune"),
    )
    summarize(tuner.fit(), args, "eval_accuracy", "evals", ["learning_rate", "warmup_steps", "weight_decay"])


if __name__ == "__main__":
    main()
