"""``examples/lightning_mlp.py`` with a fault injected mid-fit, for tests/multirank/test_lightning.py.

In trial ``fault.trial`` of the first torchrun attempt only (torchrun's ``TORCHELASTIC_RESTART_COUNT``,
so a restarted group runs the rest of the sweep cleanly), from ``on_train_batch_start``:

- ``fault.kind=raise``: rank ``fault.rank`` raises ``RuntimeError("injected failure on rank <r>")`` at
  global step ``fault.step``;
- ``fault.kind=block``: at global step ``fault.step`` every rank touches ``<DSO_MARK_DIR>/in_fit`` and
  then blocks inside ``fit`` (an hour's sleep) until a signal ends it: a test sends SIGTERM then, and
  however late it comes, it lands inside ``fit``;
- ``fault.kind=slow``: from global step ``fault.step`` on, every rank touches ``<DSO_MARK_DIR>/in_fit`` and
  sleeps ``fault.sleep`` seconds per batch (a trial long enough to be preempted where it checks).

With ``DSO_MARK_DIR`` set, every rank also writes ``start_trial<N>_rank<R>`` holding the global step its
``fit`` started at (the checkpoint's step in a resumed trial).

With ``DSO_MEMORY_DIR`` set (no fault needed), every rank writes, at the start of each trial (so after
the previous trial's teardown), ``memory_trial<N>_rank<R>.json`` from ``tests/apps/memory_probe.py``.
"""

import json
import os
import sys
import time
from pathlib import Path

import hydra
import lightning.pytorch as pl
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))

import lightning_mlp  # noqa: E402  (examples/lightning_mlp.py)
from memory_probe import memory_probe  # noqa: E402  (tests/apps/memory_probe.py)
from hydra_plugins.ds_optuna_sweeper import current_trial, in_trial, run_then_exit  # noqa: E402


class InjectFault(pl.Callback):
    def __init__(self, kind: str, rank: int, step: int, sleep: float = 0.0) -> None:
        self.kind, self.rank, self.step, self.sleep = kind, rank, step, sleep

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.kind == "raise" and trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"injected failure on rank {self.rank}")
        if self.kind == "block" and trainer.global_step == self.step:
            Path(os.environ["DSO_MARK_DIR"], "in_fit").touch()
            time.sleep(3600)  # rank 0's SIGTERM handler raises out of it; the other ranks die of it
        if self.kind == "slow" and trainer.global_step >= self.step:
            Path(os.environ["DSO_MARK_DIR"], "in_fit").touch()
            time.sleep(self.sleep)


class StartStep(pl.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        trial = current_trial()
        Path(os.environ["DSO_MARK_DIR"], f"start_trial{trial.number}_rank{trial.rank}").write_text(str(trainer.global_step))


@hydra.main(config_path=str(REPO / "conf"), config_name="lightning_mlp", version_base="1.3")
def main(cfg: DictConfig) -> float:
    fault = cfg.get("fault")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if os.environ.get("DSO_MEMORY_DIR") and in_trial():
        trial = current_trial()
        probe = {"trial_number": trial.number, "rank": trial.rank, **memory_probe()}
        Path(os.environ["DSO_MEMORY_DIR"], f"memory_trial{trial.number}_rank{trial.rank}.json").write_text(
            json.dumps(probe, indent=1))
    callbacks = []
    if fault and first_attempt and in_trial() and current_trial().number == int(fault.trial):
        callbacks.append(InjectFault(str(fault.get("kind", "raise")), int(fault.get("rank", 0)), int(fault.step),
                                     float(fault.get("sleep", 0.0))))
    if os.environ.get("DSO_MARK_DIR") and in_trial():
        callbacks.append(StartStep())
    return lightning_mlp.run_trial(cfg, HydraConfig.get().runtime.output_dir, callbacks=callbacks)


if __name__ == "__main__":
    run_then_exit(main)
