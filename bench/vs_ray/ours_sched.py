"""ours.py for the schedulers that pause and continue (``hydra/sweeper/scheduler=asha`` / ``pbt``, issue 41).

The same task, space (conf/ours_sched.yaml: conf/ours.yaml with no pruner) and report as ours.py (step = epochs done), plus the three checkpoint lines
a pausing scheduler needs: after each report, ``trial.should_preempt()``; on True, rank 0 saves weights, optimizer
state and epochs done in ``trial.checkpoint_dir`` as ``step=<epochs>.ckpt`` (through a temporary name) and the
trial returns; a continuation (an ASHA promotion, a PBT member's next interval or a clone of another member's
checkpoint) loads ``trial.resume_from`` and goes on with its own (for a clone: mutated) lr.

    torchrun --nproc-per-node 2 bench/vs_ray/ours_sched.py -m \
        hydra/sweeper/scheduler=asha hydra.sweeper.scheduler.min_steps=1 hydra.sweeper.scheduler.max_steps=12 \
        hydra.sweeper.scheduler.reduction_factor=3
"""

import os

import hydra
import optuna
import torch
import torch.distributed as dist
from omegaconf import DictConfig

from digits import state, train
from hydra_plugins.ds_optuna_sweeper import current_trial


@hydra.main(config_path="conf", config_name="ours_sched", version_base="1.3")
def main(cfg: DictConfig) -> float:
    rank, world_size = dist.get_rank(), dist.get_world_size()  # the sweeper created the group
    trial = current_trial()
    resume = torch.load(trial.resume_from, weights_only=True) if trial.resume_from else None
    handles: dict = {}
    acc = 0.0
    for epoch, acc in train(cfg.params, cfg.epochs, rank, world_size, cfg.timing_log, resume, handles):
        trial.report(acc, epoch + 1)  # step = epochs done, as Ray's schedulers count time_attr="epoch"
        if trial.should_prune():
            raise optuna.TrialPruned()
        if trial.should_preempt():  # a pause (ASHA rung, PBT interval) or SIGTERM: save and return
            if rank == 0:
                os.makedirs(trial.checkpoint_dir, exist_ok=True)
                path = os.path.join(trial.checkpoint_dir, f"step={epoch + 1}.ckpt")
                torch.save(state(handles, epoch + 1), path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()
            return acc
    return acc


if __name__ == "__main__":
    main()
