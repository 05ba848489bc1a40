"""plain.py under the ds_optuna sweeper: the search space and pruner live in conf/ours.yaml.

    torchrun --nproc-per-node 2 bench/vs_ray/ours.py -m                          # 2-rank trials, one at a time
    torchrun --nproc-per-node 2 bench/vs_ray/ours.py -m hydra.sweeper.n_jobs=2   # two 1-rank trials at once
"""

import hydra
import optuna
import torch.distributed as dist
from omegaconf import DictConfig

from digits import train
from hydra_plugins.ds_optuna_sweeper import current_trial


@hydra.main(config_path="conf", config_name="ours", version_base="1.3")
def main(cfg: DictConfig) -> float:
    rank, world_size = dist.get_rank(), dist.get_world_size()  # the sweeper created the group
    trial = current_trial()
    acc = 0.0
    for epoch, acc in train(cfg.params, cfg.epochs, rank, world_size, cfg.timing_log):
        trial.report(acc, epoch + 1)  # step = epochs done, as Ray's ASHA counts time_attr="epoch"
        if trial.should_prune():
            raise optuna.TrialPruned()
    return acc


if __name__ == "__main__":
    main()
