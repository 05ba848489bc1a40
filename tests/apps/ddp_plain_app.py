"""Test app: a plain PyTorch DDP task, written as a user writes one (cases C39, C42).

It creates the default process group itself when none exists (``if not dist.is_initialized():``), wraps
a linear model in ``DistributedDataParallel`` and trains it a few steps on fixed data, at every world
size, with no branch on the world size. Each rank logs its own lines through ``logging`` (``task line``)
and writes ``$DSO_RECORD_DIR/trial<N>_rank<R>.json`` (rank, world size, backend, job dir; ``N`` is 0 in a
single run). ``DSO_DELAY_RANK``/``DSO_DELAY_S``: that rank starts later (case C49).
"""

import json
import logging
import os
from pathlib import Path

import hydra
import optuna
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from hydra_plugins.ds_optuna_sweeper import current_trial, in_trial

log = logging.getLogger(__name__)

# Case C49: start this rank later than the others, so Hydra's `${now:...}` run dir differs per rank.
if os.environ.get("DSO_DELAY_RANK") == os.environ.get("RANK", "0"):
    import time

    time.sleep(float(os.environ.get("DSO_DELAY_S", "1.5")))


@hydra.main(config_path="conf", config_name="ddp_plain", version_base="1.3")
def main(cfg: DictConfig) -> float:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    number = int(HydraConfig.get().job.num) if in_trial() else 0
    log.info("task line: rank %d/%d starts with lr %s", rank, world_size, cfg.lr)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg.lr))
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    y = x.sum(dim=1, keepdim=True)
    loss = torch.zeros(())
    for step in range(int(cfg.steps)):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        log.info("task line: rank %d step %d loss %.4f", rank, step, float(loss))
        if cfg.prune_on_trial is not None and int(cfg.prune_on_trial) == number and step == 1:
            trial = current_trial()
            trial.report(float(loss), step)
            raise optuna.TrialPruned(f"pruned at step {step}")
    if cfg.fail_on_rank is not None and int(cfg.fail_on_rank) == rank:
        if cfg.fail_on_trial is None or int(cfg.fail_on_trial) == number:
            raise RuntimeError(f"injected failure on rank {rank}")
    out = Path(os.environ.get("DSO_RECORD_DIR", HydraConfig.get().runtime.output_dir))
    out.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "world_size": world_size, "backend": str(dist.get_backend()),
              "in_trial": in_trial(), "output_dir": HydraConfig.get().runtime.output_dir,
              "loss": float(loss)}
    (out / f"trial{number}_rank{rank}.json").write_text(json.dumps(record))
    return float(loss)


if __name__ == "__main__":
    run_recorded(main)
