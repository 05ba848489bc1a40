"""Test app: each rank records the trial it ran to $DSO_RECORD_DIR/trial<N>_rank<R>.json."""

import hashlib
import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.ds_optuna_sweeper.trial import current_trial, in_trial


@hydra.main(config_path="conf", config_name="app", version_base="1.3")
def main(cfg: DictConfig) -> float:
    rank = int(os.environ.get("RANK", "0"))
    hc = HydraConfig.get()
    if cfg.rank_specific:
        OmegaConf.set_struct(cfg, False)
        cfg.rank_value = rank  # differs per rank: but the check runs before the task, so use env
    resolved = OmegaConf.to_container(cfg, resolve=True)
    record = {
        "rank": rank,
        "job_num": int(hc.job.num),
        "output_dir": hc.runtime.output_dir,
        "config": resolved,
        "config_hash": hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest(),
        "trial_number": current_trial().number if in_trial() else None,
        "trial_params": current_trial().params if in_trial() else None,
        "types": {k: type(v).__name__ for k, v in resolved.items() if not isinstance(v, dict)},
    }
    out = Path(os.environ.get("DSO_RECORD_DIR", hc.runtime.output_dir))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"trial{hc.job.num}_rank{rank}.json").write_text(json.dumps(record, indent=1, default=str))
    time.sleep(float(cfg.sleep_s))
    if cfg.fail_on_rank is not None and int(cfg.fail_on_rank) == rank:
        if cfg.fail_on_trial is None or int(cfg.fail_on_trial) == int(hc.job.num):
            raise RuntimeError(f"injected failure on rank {rank}")
    if cfg.nan_on_rank is not None and int(cfg.nan_on_rank) == rank:
        return float("nan")
    return float(cfg.x) ** 2 + float(cfg.y)


if __name__ == "__main__":
    main()
