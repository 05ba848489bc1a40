"""Test app for C34 and C41: a task whose rank-consistent calls are made on some ranks only, and a task that
waits to be interrupted.

Every trial reports and asks about pruning at steps 0..2 on every rank, then suggests ``lr``. With
``+only_rank0=<call>`` (``report``, ``should_prune``, ``suggest``, ``report_and_prune``: the pruning-callback
shape of optuna/optuna#1417, a metric logged on rank 0 only), trial ``+skip_trial`` (default 1) makes that
call on rank 0 only; ``+then=collective`` sends the other ranks into a training ``all_reduce`` right after
the skipped call instead of returning. ``+wait_s=<s>``: in trial ``+wait_trial`` (default 1) every rank
sleeps at the task's start (after writing ``$DSO_RECORD_DIR/started_trial<N>_rank<R>``), for Ctrl-C tests;
``+wait_rank=<r>``: that rank only; ``+wait_at=end``: after the task's calls, just before it returns;
``+others_collective=true``: in that trial the ranks that do not wait sit in a training ``all_reduce`` that the
waiting rank never joins (a rank blocked while its peer is interrupted).

Each rank's exit status goes to ``$DSO_EXIT_DIR`` (``tests/apps/exit_record.py``).
"""

import os
import signal
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from hydra_plugins.ds_optuna_sweeper import current_trial

RANK = int(os.environ.get("RANK", "0"))
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal starts it, even from a background job


@hydra.main(config_path="conf", config_name="app", version_base="1.3")
def main(cfg: DictConfig) -> float:
    number = int(HydraConfig.get().job.num)
    trial = current_trial()
    out = Path(os.environ.get("DSO_RECORD_DIR") or HydraConfig.get().runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"started_trial{number}_rank{RANK}").write_text(str(os.getpid()))
    wait_rank = cfg.get("wait_rank")
    waits = bool(cfg.get("wait_s")) and number == int(cfg.get("wait_trial", 1)) and (
        wait_rank is None or int(wait_rank) == RANK)
    if waits and cfg.get("wait_at", "start") == "start":
        time.sleep(float(cfg.wait_s))
    elif cfg.get("others_collective") and number == int(cfg.get("wait_trial", 1)):
        import torch
        import torch.distributed as dist

        dist.all_reduce(torch.ones(1))  # the waiting rank never joins
    skipping = cfg.get("only_rank0") if number == int(cfg.get("skip_trial", 1)) and RANK != 0 else None
    then = cfg.get("then", "return")

    def skipped(call: str) -> bool:
        if skipping is not None and skipping in (call, "report_and_prune" if call in ("report", "should_prune") else ""):
            if then == "collective":  # goes on training: waits in the next gradient all-reduce
                import torch
                import torch.distributed as dist

                dist.all_reduce(torch.ones(1))
            return True
        return False

    value = float(cfg.x) ** 2
    for step in range(3):
        if not skipped("report"):
            trial.report(value - 0.1 * step, step)
        if not skipped("should_prune"):
            trial.should_prune()
    if not skipped("suggest"):
        trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    if waits and cfg.get("wait_at") == "end":
        time.sleep(float(cfg.wait_s))
    return value


if __name__ == "__main__":
    run_recorded(main)
