"""Plain PyTorch DDP under the ds_optuna sweeper: an MLP on scikit-learn's digits.

The sweeper searches the depth (``model.n_layers``) and the learning rate; the width of each layer
is suggested inside the task (define-by-run, rank 0 samples, every rank receives the same int);
validation accuracy is reported every epoch and the median pruner stops bad trials on every rank
at the same epoch. On SIGTERM (SLURM, torchrun, a spot notice) the trial saves a checkpoint in
``trial.checkpoint_dir`` and returns; the sweeper re-queues it and its retry resumes from
``trial.resume_from`` (the three lines marked "Checkpoints").

    torchrun --nproc_per_node 2 examples/ddp_mlp.py -m                    # the sweep (12 trials)
    python examples/ddp_mlp.py -m                                         # the same sweep at world size 1
    python examples/ddp_mlp.py                                            # one plain run

In a sweep the model is always wrapped in DDP: at world size 1 too, the sweeper creates a one-process
default group, so the task's code does not branch on the world size.

With ``DSO_RECORD_DIR`` set, every rank writes ``trial<n>_rank<r>.json`` per trial (rank and world size as
``torch.distributed`` reports them, params, config hash, the trial's span), for the tests.
"""

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import hydra
import optuna
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from hydra_plugins.ds_optuna_sweeper import current_trial, in_trial

log = logging.getLogger(__name__)
RECORD_DIR_ENV = "DSO_RECORD_DIR"


def make_data(val_fraction: float, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Digits (1797 8x8 images, 10 classes) scaled to [0, 1], split with a fixed seed."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_val = int(len(x) * val_fraction)
    val, train = perm[:n_val], perm[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def make_model(widths: list[int]) -> nn.Module:
    layers: list[nn.Module] = []
    n_in = 64
    for w in widths:
        layers += [nn.Linear(n_in, w), nn.ReLU()]
        n_in = w
    layers.append(nn.Linear(n_in, 10))
    return nn.Sequential(*layers)


def accuracy(model: nn.Module, data: TensorDataset, rank: int, world_size: int) -> float:
    """Accuracy over the whole validation set: each rank scores a shard, counts are summed."""
    model.eval()
    x, y = data.tensors
    idx = torch.arange(rank, len(x), world_size)
    with torch.no_grad():
        correct = (model(x[idx]).argmax(dim=1) == y[idx]).sum()
    counts = torch.tensor([float(correct), float(len(idx))])
    if world_size > 1:
        dist.all_reduce(counts)
    model.train()
    return float(counts[0] / counts[1])


@hydra.main(config_path="../conf", config_name="ddp_mlp", version_base="1.3")
def main(cfg: DictConfig) -> float:
    start = time.time()
    # In a sweep the sweeper created the group (at world size 1 too); a plain torchrun run creates it here.
    if not dist.is_initialized() and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    distributed = dist.is_initialized()  # False only in a plain `python examples/ddp_mlp.py`
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    trial = current_trial() if in_trial() else None

    widths = [
        trial.suggest_int(f"n_units_l{i}", cfg.model.units_low, cfg.model.units_high, log=True)
        if trial is not None
        else int(cfg.model.default_units)
        for i in range(int(cfg.model.n_layers))
    ]
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    model = make_model(widths)
    ddp = DistributedDataParallel(model) if distributed else model
    train, val = make_data(cfg.val_fraction, cfg.seed)
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(train, batch_size=int(cfg.batch_size), sampler=sampler)
    opt = torch.optim.SGD(ddp.parameters(), lr=float(cfg.lr), momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    # Checkpoints (1 of 3): a retried trial (after SIGTERM, a crash) starts where its last checkpoint left off.
    first_epoch, skip, steps, acc = (load_checkpoint(trial.resume_from, model, opt, float(cfg.lr))
                                     if trial and trial.resume_from else (0, 0, 0, 0.0))
    loaded = {"start_sha256": params_sha256(model), "lr_in_effect": opt.param_groups[0]["lr"], "start_step": steps}
    log.info("trial %s: widths %s, lr %.3g, %s over %d rank(s), from step %d", trial.number if trial else "-", widths,
             cfg.lr, type(ddp).__name__, world_size, steps)
    for epoch in range(first_epoch, int(cfg.epochs)):
        sampler.set_epoch(epoch)
        for batch, (xb, yb) in enumerate(loader):
            if epoch == first_epoch and batch < skip:
                continue  # the batches the checkpoint's run already trained on
            opt.zero_grad()
            loss_fn(ddp(xb), yb).backward()
            opt.step()
            steps += 1
            time.sleep(float(cfg.step_sleep_s))  # 0 but in the tests: a trial long enough to be preempted
            # Checkpoints (2 and 3 of 3): on SIGTERM every rank agrees here; save, and stop the trial.
            if trial is not None and trial.should_preempt():
                save_checkpoint(trial.checkpoint_dir, rank, model, opt, epoch, batch + 1, steps, acc)
                log.info("trial %d: preempted, checkpoint saved at step %d", trial.number, steps)
                _record(cfg, trial, rank, world_size, start, **loaded, saved_sha256=params_sha256(model))
                return acc
        acc = accuracy(model, val, rank, world_size)
        if trial is not None and cfg.save_every and (epoch + 1) % int(cfg.save_every) == 0:
            save_checkpoint(trial.checkpoint_dir, rank, model, opt, epoch + 1, 0, steps, acc)  # a crash resumes here
        log.info("epoch %d: val accuracy %.4f (%d optimizer steps)", epoch, acc, steps)
        if trial is not None:
            trial.report(acc, epoch)
            if trial.should_prune():
                trial.set_user_attr("optimizer_steps", steps)
                log.info("trial %d pruned at epoch %d", trial.number, epoch)
                _record(cfg, trial, rank, world_size, start, **loaded)
                raise optuna.TrialPruned(f"pruned at epoch {epoch}")
    if trial is not None:
        trial.set_user_attr("optimizer_steps", steps)
        _record(cfg, trial, rank, world_size, start, **loaded)
    if trial is None and rank == 0:
        print(f"val accuracy: {acc:.4f}")
    return acc


def save_checkpoint(directory: str, rank: int, model: nn.Module, opt: torch.optim.Optimizer, epoch: int,
                    batch: int, steps: int, acc: float) -> None:
    """Rank 0 writes ``<directory>/step=<steps>.ckpt`` (through a temporary name, so a kill mid-write leaves no
    partial checkpoint) and deletes the older ones; every rank waits for it. ``batch``: batches of ``epoch``
    already trained on; ``acc``: the last validation accuracy."""
    if rank == 0:
        Path(directory).mkdir(parents=True, exist_ok=True)
        path = os.path.join(directory, f"step={steps}.ckpt")
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch, "batch": batch, "steps": steps,
                 "acc": acc}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
        for older in Path(directory).glob("step=*.ckpt"):  # the trial keeps its newest checkpoint only
            if str(older) != path:
                older.unlink()
    if dist.is_initialized():
        dist.barrier()


def load_checkpoint(path: str, model: nn.Module, opt: torch.optim.Optimizer, lr: float) -> tuple[int, int, int, float]:
    """Load a :func:`save_checkpoint` file into ``model`` and ``opt``, then set this trial's ``lr`` (the optimizer's
    state holds the saved run's: under hydra/sweeper/scheduler=pbt a member continues from another member's
    checkpoint with a new learning rate); return (epoch, batches done in it, steps, last validation accuracy)."""
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    for group in opt.param_groups:
        group["lr"] = lr
    return int(state["epoch"]), int(state["batch"]), int(state["steps"]), float(state["acc"])


def params_sha256(model: nn.Module) -> str:
    """A hash of the model's weights (for the tests: a PBT clone starts from the cloned member's weights)."""
    digest = hashlib.sha256()
    for value in model.state_dict().values():
        digest.update(value.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def _record(cfg: DictConfig, trial, rank: int, world_size: int, start: float, **extra) -> None:
    """With ``DSO_RECORD_DIR`` set, write what this rank ran in this trial (for the tests); ``extra``: the weights'
    hash and learning rate after the checkpoint's load, the weights' hash at a save."""
    record_dir = os.environ.get(RECORD_DIR_ENV)
    if not record_dir:
        return
    record = {
        "trial_number": trial.number, "rank": rank, "world_size": world_size, "params": trial.params,
        "config_sha256": hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest(),
        "start": start, "end": time.time(), **extra,
    }
    Path(record_dir).mkdir(parents=True, exist_ok=True)
    Path(record_dir, f"trial{trial.number}_rank{rank}.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    from hydra_plugins.ds_optuna_sweeper import run_then_exit

    # A torch/gloo process sometimes aborts at interpreter exit ("terminate called without an active
    # exception", seen once in CI after a complete sweep); flush and leave with os._exit instead.
    run_then_exit(main)
