"""PyTorch Lightning under the ds_optuna sweeper: a LightningModule MLP on scikit-learn's digits.

The sweeper searches the depth (``model.n_layers``) and the learning rate; the width of each layer
is suggested inside the task (define-by-run: rank 0 samples, every rank receives the same int).
Lightning's DDP strategy runs in the torchrun world the sweeper set up (CPU, gloo); validation
accuracy is reported after every epoch and the median pruner stops bad trials on every rank after
the same epoch.

    torchrun --nproc_per_node 2 examples/lightning_mlp.py -m              # the sweep (12 trials)
    torchrun --nproc_per_node 2 examples/lightning_mlp.py                 # one plain run
    python examples/lightning_mlp.py -m trainer.strategy=auto             # one process

With ``DSO_RECORD_DIR`` set, every rank writes ``trial<n>_rank<r>.json`` per trial (params, config
hash, widths, where it stopped, Lightning's world size, the trial's span, resident memory at the trial's
start), for the tests.
"""

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

import hydra
import lightning.pytorch as pl
import torch
from ddp_mlp import make_data, make_model  # the plain DDP example's data and model, same folder
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader

from hydra_plugins.ds_optuna_sweeper import (
    current_trial,
    in_trial,
    lightning_pruning_callback,
    lightning_trial_scope,
    run_then_exit,
)

log = logging.getLogger(__name__)
RECORD_DIR_ENV = "DSO_RECORD_DIR"


class DigitsMLP(pl.LightningModule):
    """An MLP classifier: ``widths`` hidden layers of ReLU units, SGD with momentum 0.9 at ``lr``."""

    def __init__(self, widths: list[int], lr: float) -> None:
        super().__init__()
        self.net = make_model(widths)
        self.lr = lr
        self.loss = nn.CrossEntropyLoss()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        # Mean over this rank's batches, then over ranks (sync_dist): every rank logs the same value.
        self.log("val_acc", (self.net(x).argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def world() -> dict[str, int]:
    """Lightning's ``devices`` and ``num_nodes`` for the launcher's world (torchrun's environment, or one
    process): Lightning checks that their product is ``WORLD_SIZE``."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return {"devices": per_node, "num_nodes": world_size // per_node}


def run_trial(cfg: DictConfig, output_dir: str, callbacks: Optional[list] = None) -> float:
    """Train and validate one configuration; returns the last validation accuracy (a fraction).

    Args:
        cfg: the composed config (``conf/lightning_mlp.yaml`` with the trial's overrides).
        output_dir: where Lightning writes (the job dir under the sweep dir).
        callbacks: extra Lightning callbacks (the tests inject faults with them).

    Raises:
        optuna.TrialPruned: on every rank, after the same epoch, when the pruner stops the trial.
    """
    trial = current_trial() if in_trial() else None
    rss_at_start, start = _rss_mib(), time.time()
    widths = [
        trial.suggest_int(f"n_units_l{i}", cfg.model.units_low, cfg.model.units_high, log=True)
        if trial is not None
        else int(cfg.model.default_units)
        for i in range(int(cfg.model.n_layers))
    ]
    with lightning_trial_scope() as scope:
        pl.seed_everything(int(cfg.seed), workers=True, verbose=False)  # same weights and order on every rank
        train, val = make_data(cfg.val_fraction, cfg.seed)
        pruning = lightning_pruning_callback(monitor="val_acc")
        trainer = scope.track(pl.Trainer(
            **OmegaConf.to_container(cfg.trainer, resolve=True), **world(), max_epochs=int(cfg.epochs),
            callbacks=[pruning, *(callbacks or [])], default_root_dir=output_dir, logger=_loggers(cfg, output_dir),
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        ))
        log.info("trial %s: widths %s, lr %.3g", trial.number if trial else "-", widths, cfg.lr)
        trainer.fit(DigitsMLP(widths, float(cfg.lr)),
                    DataLoader(train, batch_size=int(cfg.batch_size), shuffle=True),
                    DataLoader(val, batch_size=256))
        accuracy = float(trainer.callback_metrics["val_acc"])
        log.info("stopped after epoch %d (%d optimizer steps)%s", trainer.current_epoch - 1, trainer.global_step,
                 f"; trial {trial.number} pruned at epoch {pruning.pruned_at}" if pruning.pruned_at is not None else "")
        _record(cfg, trial, widths, trainer, pruning, rss_at_start, start)
        pruning.raise_if_pruned()
    return accuracy


def _loggers(cfg: DictConfig, output_dir: str) -> Any:
    """Lightning's loggers named by ``cfg.loggers`` (``mlflow``, ``tensorboard``), or False for none. With
    ``hydra.sweeper.tracking`` the scope's ``track`` points them at the trial's run (docs/how-to/tracking.md, "Tracking")."""
    made: list[Any] = []
    for name in cfg.get("loggers") or []:
        if name == "mlflow":  # (Lightning's default tracking_uri is MLFLOW_TRACKING_URI when Lightning was imported)
            made.append(pl.loggers.MLFlowLogger(tracking_uri=os.environ.get("MLFLOW_TRACKING_URI")))
        elif name == "tensorboard":
            made.append(pl.loggers.TensorBoardLogger(save_dir=output_dir))
        else:
            raise ValueError(f"loggers: {name!r} is not one of mlflow, tensorboard")
    return made or False


@hydra.main(config_path="../conf", config_name="lightning_mlp", version_base="1.3")
def main(cfg: DictConfig) -> float:
    accuracy = run_trial(cfg, HydraConfig.get().runtime.output_dir)
    if not in_trial() and int(os.environ.get("RANK", "0")) == 0:
        print(f"val accuracy: {accuracy:.4f}")
    return accuracy


def _rss_mib() -> float:
    """This process's resident set size (MiB), from ``/proc/self/statm``; 0.0 where there is none."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _record(cfg: DictConfig, trial: Any, widths: list[int], trainer: Any, pruning: Any, rss: float,
            start: float) -> None:
    """With ``DSO_RECORD_DIR`` set, write what this rank ran in this trial (for the tests)."""
    record_dir = os.environ.get(RECORD_DIR_ENV)
    if not record_dir or trial is None:
        return
    record = {
        "trial_number": trial.number, "rank": trial.rank, "params": trial.params, "widths": widths,
        "config_sha256": hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest(),
        "global_step": trainer.global_step, "pruned_at": pruning.pruned_at,
        "val_acc": float(trainer.callback_metrics["val_acc"]), "rss_mib_at_start": rss,
        "world_size": trainer.world_size, "start": start, "end": time.time(),
    }
    Path(record_dir, f"trial{trial.number}_rank{trial.rank}.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    run_then_exit(main)
