"""Test app of case C35: a task that cuts the sweeper's storage connections at chosen points.

Each trial reports ``x**2 + step`` at steps 0..steps-1 (sleeping ``sleep_s`` after each, so the
heartbeat thread beats during the outages) and returns ``x**2``. Rank 0 cuts where ``DSO_C35_CUTS``
says (``tests/apps/pg_cut.py``); the config is the sweep app's (``conf/app.yaml``).
"""

import time

import hydra
from omegaconf import DictConfig

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from pg_cut import cut_here, install_hooks  # tests/apps/pg_cut.py
from hydra_plugins.ds_optuna_sweeper import current_trial

install_hooks()


@hydra.main(config_path="conf", config_name="app", version_base="1.3")
def main(cfg: DictConfig) -> float:
    trial = current_trial()
    value = float(cfg.x) ** 2
    for step in range(int(cfg.steps)):
        if step == 1:
            cut_here("report", trial.number)
        trial.report(value + step, step)
        time.sleep(float(cfg.sleep_s))
    cut_here("end", trial.number)
    return value


if __name__ == "__main__":
    run_recorded(main)
