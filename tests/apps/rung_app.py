"""Test app for the schedulers (issue 41): a "training" loop of ``steps`` steps that resumes from its checkpoint.

Each step reports ``loss = (x - 0.3) ** 2 + 1 / (step + 1)`` (a curve that falls with the steps, lower for x
near 0.3), then asks ``should_preempt()``; on True rank 0 saves ``step=<step>.ckpt`` (JSON: the step and x) through
a temporary name and ``os.replace``, and every rank returns the loss. A run resumes after the step its checkpoint
holds. Each rank appends one line per run to ``$DSO_RECORD_DIR/runs_rank<R>.jsonl``: the trial, x, the step it
started at and the last step it ran, whether it was paused, and the x its checkpoint held (PBT: a clone's is
the cloned member's).
"""

import json
import os
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from hydra_plugins.ds_optuna_sweeper import current_trial



@hydra.main(version_base="1.3", config_path="conf", config_name="rung")
def main(cfg: DictConfig) -> float:
    trial = current_trial()
    start, ckpt_x = 0, None
    if trial.resume_from:
        saved = json.loads(Path(trial.resume_from).read_text())
        start, ckpt_x = saved["step"] + 1, saved["x"]
    loss, step = float("nan"), start - 1
    paused = False
    for step in range(start, cfg.steps):
        time.sleep(cfg.sleep_s)
        loss = (cfg.x - 0.3) ** 2 + 1.0 / (step + 1)
        trial.report(loss, step)
        if cfg.get("sigterm_at_step") == step and trial.rank == 0:  # SIGTERM at this step, before the check
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
        if trial.should_preempt():
            paused = True
            if trial.rank == 0:  # the trial's rank: with trial groups, the rank in its group
                os.makedirs(trial.checkpoint_dir, exist_ok=True)
                name = cfg.ckpt_name.format(step=step)
                tmp = Path(trial.checkpoint_dir, f"{name}.tmp")
                tmp.write_text(json.dumps({"step": step, "x": cfg.x}))
                os.replace(tmp, Path(trial.checkpoint_dir, name))
            break
    record_dir = os.environ.get("DSO_RECORD_DIR")
    if record_dir:
        os.makedirs(record_dir, exist_ok=True)
        with open(Path(record_dir, f"runs_rank{trial.rank}.jsonl"), "a") as f:
            f.write(json.dumps({"trial": trial.number, "x": cfg.x, "start": start, "last": step,
                                "paused": paused, "ckpt_x": ckpt_x}) + "\n")
    return loss


if __name__ == "__main__":
    main()
