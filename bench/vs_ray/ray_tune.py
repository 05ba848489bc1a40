"""plain.py under Ray Tune 2.x: a Tune trial runs a Ray Train ``TorchTrainer``; ``OptunaSearch`` + ASHA.

The same search as ours.py / conf/ours.yaml: TPE seed 0 after 4 random trials (Ray's ``OptunaSearch``
wraps the same Optuna sampler), the same space (``tune.loguniform`` / ``randint`` / ``lograndint`` become
the same Optuna distributions), ASHA with grace period 1 epoch and reduction factor 4. Ray Train V2's
documented shape (Ray >= 2.43): each Tune trial is a small driver function that runs a ``TorchTrainer``
whose workers report to Tune through ``TuneReportCallback``.

    pip install 'ray[default,tune,train]==2.60.0'   # for this benchmark only (default: the dashboard)
    python bench/vs_ray/ray_tune.py --trials 12 --workers 2 --concurrent 1   # 2-rank trials, one at a time
    python bench/vs_ray/ray_tune.py --trials 12 --workers 1 --concurrent 2   # two 1-rank trials at once
"""

import argparse
import json
import os
import sys
import tempfile

import ray
import ray.train
import ray.train.torch
import torch.distributed as dist
from optuna.samplers import TPESampler
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch

from digits import train

HERE = os.path.dirname(os.path.abspath(__file__))


def train_fn_per_worker(config: dict) -> None:
    """One Ray Train worker: the plain loop, reporting every epoch."""
    rank, world_size = dist.get_rank(), dist.get_world_size()  # TorchTrainer created the group
    for epoch, acc in train(config["params"], config["epochs"], rank, world_size, config["timing_log"]):
        ray.train.report({"acc": acc, "epoch": epoch + 1})


def driver(config: dict) -> None:
    """One Tune trial: a TorchTrainer over ``workers`` CPU workers with the trial's params."""
    trainer = ray.train.torch.TorchTrainer(
        train_fn_per_worker,
        train_loop_config={"params": {k: config[k] for k in ("lr", "n_layers", "n_units")},
                           "epochs": config["epochs"], "timing_log": config["timing_log"]},
        scaling_config=ray.train.ScalingConfig(num_workers=config["workers"], use_gpu=False),
        run_config=ray.train.RunConfig(storage_path=config["storage"], callbacks=[TuneReportCallback()],
                                       name=f"train-{tune.get_context().get_trial_id()}"),
        torch_config=ray.train.torch.TorchConfig(backend="gloo"),
    )
    trainer.fit()


def parse_args(trials: int) -> argparse.Namespace:
    """The command line shared with hf_ray_tune.py."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=trials)
    ap.add_argument("--workers", type=int, default=2, help="ranks per trial")
    ap.add_argument("--concurrent", type=int, default=1, help="trials at once")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--timing-log", default=None)
    ap.add_argument("--storage", default=None)
    ap.add_argument("--summary", default=None, help="write the trials (state, reports, value, seconds) as JSON here")
    args = ap.parse_args()
    args.storage = args.storage or tempfile.mkdtemp(prefix="ray-tune-")
    return args


def start_ray(args: argparse.Namespace, paths: list[str], resources: dict | None = None) -> None:
    """A local Ray with a CPU per worker of every concurrent trial; ``paths`` go on the workers' PYTHONPATH;
    ``resources``: custom resources of the node (ray_sched.py's PBT: one member at a time)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
    # The dashboard serves the State API that Ray Train V2's PlacementGroupCleaner polls: without it, every
    # trial Tune stops (ASHA, or max_t reached) leaks its worker group's placement group and the next trial
    # waits for CPUs forever (seen here with include_dashboard=False). One CPU more for the drivers' 0.01s.
    ray.init(num_cpus=args.workers * args.concurrent + 1, include_dashboard=True, resources=resources,
             _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})


def summarize(grid: tune.ResultGrid, args: argparse.Namespace, metric: str, time_attr: str, keys: list[str]) -> None:
    """Print the best trial; with ``--summary``, write every trial's reports, value, seconds and params."""
    best = grid.get_best_result()
    print(f"best {metric} {best.metrics[metric]:.4f} params {best.config}", file=sys.stderr)
    if args.summary:
        trials = [{"reports": r.metrics.get(time_attr), "value": r.metrics.get(metric),
                   "error": repr(r.error) if r.error else None, "time_total_s": r.metrics.get("time_total_s"),
                   "params": {k: r.config[k] for k in keys}} for r in grid]
        with open(args.summary, "w") as f:
            json.dump({"best": best.metrics[metric], "trials": trials}, f, indent=1)


def main() -> None:
    args = parse_args(trials=12)
    start_ray(args, [HERE])  # the workers import digits.py from this folder
    space = {"lr": tune.loguniform(1e-4, 1e-1), "n_layers": tune.randint(1, 5), "n_units": tune.lograndint(4, 129),
             "epochs": args.epochs, "workers": args.workers, "timing_log": args.timing_log, "storage": args.storage}
    tuner = tune.Tuner(
        tune.with_resources(driver, {"CPU": 0.01}),  # the driver only waits; the workers take the CPUs
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="acc", mode="max", num_samples=args.trials, max_concurrent_trials=args.concurrent,
            search_alg=OptunaSearch(sampler=TPESampler(seed=0, n_startup_trials=4)),
            scheduler=ASHAScheduler(time_attr="epoch", max_t=args.epochs, grace_period=1, reduction_factor=4)),
        run_config=tune.RunConfig(storage_path=args.storage, name="tune"),
    )
    summarize(tuner.fit(), args, "acc", "epoch", ["lr", "n_layers", "n_units"])


if __name__ == "__main__":
    main()
