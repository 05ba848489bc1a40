"""Test app for the edges of a sweep (tests/test_sweep_edges.py): a task that, in trial
``misuse_trial``, does what users get wrong.

- ``init_group``: ``torch.distributed.init_process_group("gloo")`` without checking ``is_initialized``;
- ``destroy_group``: ``torch.distributed.destroy_process_group()`` at the end of the task;
- ``report``: ``current_trial().report(...)`` although the study has several objectives;
- ``close_own_trial``: another worker's stale check, simulated: the task fails its own RUNNING
  trial through a second connection to the storage (``$DSO_STORAGE``), as Optuna's
  ``fail_stale_trials`` in another group would.

Each rank appends ``{"trial", "rank"}`` to ``$DSO_RECORD_DIR/ran.jsonl`` for every trial it starts.
With ``DSO_EXIT_DIR`` set, each rank's observed exit status is recorded (``tests/apps/exit_record.py``).
"""

import json
import os
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from hydra_plugins.ds_optuna_sweeper import current_trial

RANK = int(os.environ.get("RANK", "0"))


@hydra.main(config_path="conf", config_name="edge", version_base="1.3")
def main(cfg: DictConfig):
    trial = current_trial()
    record = Path(os.environ["DSO_RECORD_DIR"])
    record.mkdir(parents=True, exist_ok=True)
    with open(record / "ran.jsonl", "a") as f:
        f.write(json.dumps({"trial": trial.number, "rank": RANK}) + "\n")
    time.sleep(float(cfg.sleep_s))
    value = float(cfg.x) ** 2
    if trial.number == int(cfg.misuse_trial):
        if cfg.misuse == "init_group":
            import torch.distributed as dist

            dist.init_process_group("gloo")
        elif cfg.misuse == "report":
            trial.report(value, 0)
        elif cfg.misuse == "close_own_trial" and RANK == 0:
            import optuna

            other = optuna.load_study(study_name=os.environ["DSO_STUDY"], storage=os.environ["DSO_STORAGE"])
            other.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        elif cfg.misuse == "destroy_group":
            import torch.distributed as dist

            dist.destroy_process_group()
    if int(cfg.n_objectives) == 2:
        return [value, -value]
    return value


if __name__ == "__main__":
    run_recorded(main)
