"""Test app for rerun lines (case C19): a deterministic objective of the config group ``opt``, the
fixed override ``+extra``, params suggested inside the task (``layers > 0``) and the world size.

Works in a sweep (``-m``) and in a single run; rank 0 writes what it returned to
``$DSO_RECORD_DIR/value_<sweep|single>_<stage>_<trial or run>.json``. ``stage=final`` (the refit stage)
adds 10 to the value, or raises with ``fail_final=true``; it returns a dict of metrics, or the number
itself with ``+final_returns_number=true``. With ``DSO_EXIT_DIR`` set, each rank's observed exit status
is recorded (``tests/apps/exit_record.py``).
"""

import json
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from hydra_plugins.ds_optuna_sweeper import current_trial, in_trial


@hydra.main(config_path="conf_rerun", config_name="rerun", version_base="1.3")
def main(cfg: DictConfig):
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    trial = current_trial() if in_trial() else None
    units = [trial.suggest_int(f"n_units_l{i}", 4, 128, log=True) for i in range(int(cfg.layers))] if trial else []
    value = (float(cfg.x) - 0.3) ** 2 + float(cfg.opt.scale) + 0.01 * world_size + 0.001 * sum(units)
    value += float(cfg.get("extra", 0)) + (0.5 if cfg.config == "other" else 0.0)
    if cfg.stage == "final":
        if cfg.fail_final:
            raise RuntimeError("injected refit failure")
        value += 10.0
    if int(os.environ.get("RANK", "0")) == 0:
        out = Path(os.environ["DSO_RECORD_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        from hydra.core.hydra_config import HydraConfig

        mode = "sweep" if HydraConfig.get().mode.name == "MULTIRUN" else "single"
        tag = trial.number if mode == "sweep" else "run"
        (out / f"value_{mode}_{cfg.stage}_{tag}.json").write_text(json.dumps({"value": value, "units": units}))
    if int(cfg.n_objectives) == 2:
        return [value, -float(cfg.x)]
    if cfg.stage == "final":
        if cfg.get("final_returns_number", False):  # +final_returns_number=true: a refit returning a number
            return value
        return {"test_value": value, "units": float(sum(units))}
    return value


if __name__ == "__main__":
    run_recorded(main)
