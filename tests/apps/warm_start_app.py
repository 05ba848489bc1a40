"""Test app for warm starts (cases C32, C36): objective ``x**2 + y``, each rank recording what it ran.

Each rank writes ``$DSO_RECORD_DIR/<sweep|refit>_trial<N>_rank<R>.json`` (its resolved config and the
trial's params). While the file named by ``$DSO_BROKEN_FLAG`` exists and holds the value of ``x``, the
task raises on every rank, as a config error would (the user "fixes the config" by deleting the file).
``label=final`` (the refit override) adds 10 to the objective.
"""

import json
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from hydra_plugins.ds_optuna_sweeper import current_trial, in_trial

RANK = int(os.environ.get("RANK", "0"))


@hydra.main(config_path="conf", config_name="app", version_base="1.3")
def main(cfg: DictConfig) -> float:
    stage = "refit" if cfg.label == "final" else "sweep"
    record = {
        "rank": RANK,
        "job_num": int(HydraConfig.get().job.num),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "trial_number": current_trial().number if in_trial() else None,
        "trial_params": current_trial().params if in_trial() else None,
    }
    out = Path(os.environ["DSO_RECORD_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stage}_trial{record['trial_number']}_rank{RANK}.json").write_text(json.dumps(record, default=str))
    flag = os.environ.get("DSO_BROKEN_FLAG")
    if flag and Path(flag).exists() and float(Path(flag).read_text()) == float(cfg.x):
        raise RuntimeError(f"config error for x={cfg.x} (the flag file {flag} exists)")
    return float(cfg.x) ** 2 + float(cfg.y) + (10.0 if stage == "refit" else 0.0)


if __name__ == "__main__":
    run_recorded(main)
