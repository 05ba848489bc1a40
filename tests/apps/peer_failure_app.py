"""Test app for case C45: one rank raises inside a training loop of ``all_reduce`` calls while the others
go on with the loop (``fail.others=block``: they wait in ``dist.all_reduce`` for a rank that never comes)
or stop at the same step by themselves (``fail.others=leave``).

``fail.trial=first``: the failing rank's first trial, whatever its number (with trial groups, the trials each
group runs are not known in advance). The failing rank writes ``$DSO_RECORD_DIR/failed_trial<N>_rank<R>.json`` (``{"time": time.time()}``, its own
clock, just before it raises), so a test measures from the failure, not from the start of the run. Every
rank writes ``trial<N>_rank<R>.json`` with torchrun's attempt (``TORCHELASTIC_RESTART_COUNT``) when its
trial starts. Each rank's exit status is recorded by ``tests/apps/exit_record.py`` (``DSO_EXIT_DIR``).
"""

import json
import os
import time
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from omegaconf import DictConfig

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from hydra_plugins.ds_optuna_sweeper import current_trial

RANK = int(os.environ.get("RANK", "0"))


@hydra.main(config_path="conf", config_name="peer_failure", version_base="1.3")
def main(cfg: DictConfig) -> float:
    number = current_trial().number
    out = Path(os.environ["DSO_RECORD_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    first = not any(out.glob(f"trial*_rank{RANK}.json"))  # this process's first trial
    (out / f"trial{number}_rank{RANK}.json").write_text(json.dumps({"attempt": attempt}))
    fail = cfg.fail
    in_failing_trial = (first if fail.trial == "first" else fail.trial is not None and int(fail.trial) == number)
    for step in range(int(cfg.steps)):
        if in_failing_trial and step == int(fail.at_step):
            if RANK == int(fail.rank):
                (out / f"failed_trial{number}_rank{RANK}.json").write_text(json.dumps({"time": time.time()}))
                raise RuntimeError(f"injected failure on rank {RANK}")
            if fail.others == "leave":
                time.sleep(float(fail.leave_after_s))
                return float(cfg.x) ** 2
        t = torch.ones(1)
        dist.all_reduce(t)  # the gradient all-reduce of a training step
    return float(cfg.x) ** 2


if __name__ == "__main__":
    run_recorded(main)
