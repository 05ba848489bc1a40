"""ray_tune.py for issue 41's schedulers: Ray Tune's ``ASHAScheduler`` or ``PopulationBasedTraining`` on digits.

The task of ours_sched.py (``digits.train``, the Ray Train V2 shape of ray_tune.py: each Tune trial is a driver
that runs a ``TorchTrainer`` of ``--workers`` CPU ranks), one TorchTrainer at a time:

- ``--scheduler asha``: ``OptunaSearch`` (TPE, ``--seed``, 4 random start-up trials, as ours) and
  ``ASHAScheduler(time_attr="epoch", max_t=12, grace_period=1, reduction_factor=3)``: rungs after 1, 3 and 9
  epochs, as ours with min_steps 1, max_steps 12, reduction factor 3. ASHA stops trials; none is continued.
  ``max_concurrent_trials=1``.
- ``--scheduler pbt``: ``PopulationBasedTraining(time_attr="epoch", perturbation_interval=3,
  quantile_fraction=0.25, resample_probability=0.25)`` mutating ``lr`` only (``tune.loguniform(1e-4, 1e-1)``,
  factors 1.2 / 0.8, clipped to that range as ours clips), ``stop={"epoch": 12}``. Ray refuses a search
  algorithm with PBT, so the ``--trials`` members' first configurations are random (``BasicVariantGenerator``
  with ``--seed``), or those of ``--initial`` (``points_to_evaluate``: the benchmark gives ours' members'). PBT time-multiplexes the population only when all members exist as Tune trials, so there
  is no ``max_concurrent_trials`` (it would create one member at a time, which then never exploits another);
  instead each driver takes the one unit of a custom resource ``member``, so one member trains at a time
  and the others wait PENDING or PAUSED. Every 3 epochs a member is paused (other members wait) and the bottom quarter clones a
  top-quarter member's checkpoint.

Checkpoints (PBT only): rank 0 of the Ray Train workers reports weights + optimizer state every 3 epochs with
``ray.train.report(..., checkpoint=...)``; Ray Train V2's ``TuneReportCallback`` passes only the checkpoint's
path to Tune, not a Tune checkpoint, and PBT exploits Tune checkpoints, so the driver forwards each report itself
(``_Forward``: the Train controller's callback puts metrics and checkpoint on a queue of size 1; the driver
calls ``tune.report(metrics, checkpoint=...)``). A (re)started member reads ``tune.get_checkpoint()`` (its own
or, after an exploit, the donor's) and hands it to the workers in ``train_loop_config`` (Train V2 deprecates
``TorchTrainer(resume_from_checkpoint=...)``, ray issue 49454); they load it and set the member's (possibly
mutated) lr.

    python bench/vs_ray/ray_sched.py --scheduler asha --trials 12 --seed 0
    python bench/vs_ray/ray_sched.py --scheduler pbt --trials 8 --seed 0
"""

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import uuid

import numpy as np
import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from optuna.samplers import TPESampler
from ray import tune
from ray.train.v2.api.callback import UserCallback
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
from ray.tune.search.basic_variant import BasicVariantGenerator
from ray.tune.search.optuna import OptunaSearch
from ray.util.queue import Queue

from digits import state, train
from ray_tune import start_ray

HERE = os.path.dirname(os.path.abspath(__file__))
LR = (1e-4, 1e-1)
INTERVAL = 3
CKPT = "state.pt"


def train_fn_per_worker(config: dict) -> None:
    """One Ray Train worker: the plain loop, reporting every epoch; under PBT a checkpoint every INTERVAL epochs."""
    rank, world_size = dist.get_rank(), dist.get_world_size()  # TorchTrainer created the group
    resume = None
    if config["resume"] is not None:
        with config["resume"].as_directory() as d:
            resume = torch.load(os.path.join(d, CKPT), weights_only=True)
    handles: dict = {}
    for epoch, acc in train(config["params"], config["epochs"], rank, world_size, config["timing_log"], resume,
                            handles):
        metrics = {"acc": acc, "epoch": epoch + 1}
        if config["pbt"] and (epoch + 1) % INTERVAL == 0:
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    torch.save(state(handles, epoch + 1), os.path.join(d, CKPT))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d) if rank == 0 else None)
        else:
            ray.train.report(metrics)


class _Forward(UserCallback):
    """On the Train controller: each report's metrics and checkpoint path onto the driver's queue (size 1, so the
    training waits for Tune to take it, as TuneReportCallback's queue does)."""

    def __init__(self, queue: Queue):
        self.queue = queue

    def after_report(self, run_context, metrics, checkpoint) -> None:
        self.queue.put((metrics[0].copy(), checkpoint.path if checkpoint else None))


def driver(config: dict) -> None:
    """One Tune trial: a TorchTrainer over ``workers`` CPU workers with the trial's params."""
    trial_id = tune.get_context().get_trial_id()
    loop = {"params": {k: config[k] for k in ("lr", "n_layers", "n_units")}, "epochs": config["epochs"],
            "timing_log": config["timing_log"], "pbt": config["pbt"],
            # Train V2 deprecates TorchTrainer(resume_from_checkpoint=...): the workers load it (ray issue 49454)
            "resume": tune.get_checkpoint() if config["pbt"] else None}
    common = dict(scaling_config=ray.train.ScalingConfig(num_workers=config["workers"], use_gpu=False),
                  torch_config=ray.train.torch.TorchConfig(backend="gloo"))
    if not config["pbt"]:
        ray.train.torch.TorchTrainer(
            train_fn_per_worker, train_loop_config=loop, **common,
            run_config=ray.train.RunConfig(storage_path=config["storage"], callbacks=[TuneReportCallback()],
                                           name=f"train-{trial_id}")).fit()
        return
    queue = Queue(maxsize=1, actor_options={"num_cpus": 0})
    trainer = ray.train.torch.TorchTrainer(
        train_fn_per_worker, train_loop_config=loop, **common,
        # a new name for each start: Train V2 would otherwise restore its own run, not the checkpoint PBT gave
        run_config=ray.train.RunConfig(storage_path=config["storage"], callbacks=[_Forward(queue)],
                                       name=f"train-{trial_id}-{uuid.uuid4().hex[:8]}"))
    failure: list = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as e:  # noqa: BLE001 - handed to the driver's thread below
            failure.append(e)
        finally:
            queue.put(None)

    threading.Thread(target=fit, daemon=True).start()
    while (item := queue.get()) is not None:
        metrics, path = item
        tune.report(metrics, checkpoint=tune.Checkpoint(path) if path else None)
    if failure:
        raise failure[0]


def clip_lr(config: dict) -> dict:
    """PBT's explore multiplies lr by 1.2 or 0.8 without bounds; ours clips to the distribution's range."""
    config["lr"] = min(max(config["lr"], LR[0]), LR[1])
    return config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheduler", choices=["asha", "pbt"], required=True)
    ap.add_argument("--trials", type=int, default=12, help="ASHA: configurations; PBT: population")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="ranks per trial")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--timing-log", default=None)
    ap.add_argument("--storage", default=None)
    ap.add_argument("--summary", default=None)
    ap.add_argument("--initial", default=None, help="PBT: a JSON file of the members' first configurations "
                    "(lr, n_layers, n_units), e.g. those ours drew, so both populations start alike")
    args = ap.parse_args()
    args.storage = args.storage or tempfile.mkdtemp(prefix="ray-sched-")
    args.concurrent = 1
    random.seed(args.seed)  # PBT's choice of donor, factor and resampling
    np.random.seed(args.seed)
    start_ray(args, [HERE], resources={"member": 1})  # num_cpus = workers + 1: one TorchTrainer at a time
    pbt = args.scheduler == "pbt"
    space = {"lr": tune.loguniform(*LR), "n_layers": tune.randint(1, 5), "n_units": tune.lograndint(4, 129),
             "epochs": args.epochs, "workers": args.workers, "timing_log": args.timing_log, "storage": args.storage,
             "pbt": pbt}
    initial = None
    if args.initial:
        with open(args.initial) as f:
            initial = json.load(f)
    if pbt:
        tune_config = tune.TuneConfig(
            metric="acc", mode="max", num_samples=args.trials,
            search_alg=BasicVariantGenerator(random_state=args.seed, points_to_evaluate=initial),
            scheduler=PopulationBasedTraining(
                time_attr="epoch", perturbation_interval=INTERVAL, quantile_fraction=0.25, resample_probability=0.25,
                hyperparam_mutations={"lr": tune.loguniform(*LR)}, custom_explore_fn=clip_lr))
        resources = {"CPU": 0.01, "member": 1}  # one member's driver (and its workers) at a time
    else:
        tune_config = tune.TuneConfig(
            metric="acc", mode="max", num_samples=args.trials, max_concurrent_trials=1,
            search_alg=OptunaSearch(sampler=TPESampler(seed=args.seed, n_startup_trials=4)),
            scheduler=ASHAScheduler(time_attr="epoch", max_t=args.epochs, grace_period=1, reduction_factor=3))
        resources = {"CPU": 0.01}  # the driver only waits; the workers take the CPUs (as ray_tune.py)
    tuner = tune.Tuner(tune.with_resources(driver, resources), param_space=space, tune_config=tune_config,
                       run_config=tune.RunConfig(storage_path=args.storage, name="tune",
                                                 stop={"epoch": args.epochs} if pbt else None))
    grid = tuner.fit()
    trials = [{"epochs": r.metrics.get("epoch"), "value": r.metrics.get("acc"),
               "error": repr(r.error) if r.error else None,
               "params": {k: r.config[k] for k in ("lr", "n_layers", "n_units")}} for r in grid]
    done = [t["value"] for t in trials if t["epochs"] == args.epochs and t["value"] is not None]
    best = max(done) if done else None
    print(f"best acc {best}", file=sys.stderr)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"best": best, "trials": trials}, f, indent=1)


if __name__ == "__main__":
    main()
