"""Weights & Biases: one run per trial, grouped by the study (W&B's ``group``), written by the rank that owns the
study when the trial ends.

A trial's run id is fixed by the study (a hash of the storage and the study name) and the trial number, so a
resumed study, or a retry that resumes from a checkpoint, writes into the same run (``resume="allow"``), and the
task's own W&B logging joins it through W&B's environment variables (W&B docs, "Environment variables";
:mod:`._task_env`). This avoids W&B's own sweeps, which break under DDP (wandb/wandb#3883, #7811, #5695).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from ._record import TrialRecord, TrialStart, redact, redacted_params, start_tags


#: W&B's "no system metadata" setting (``x_disable_meta``) as an environment variable: the metadata holds the
#: process's command line, where a storage URL with its password may stand (issue 25: no secret reaches a tracker).
_NO_METADATA_ENV = "WANDB__DISABLE_META"


class WandbTracker:
    """The study's runs in one W&B project.

    Args:
        project: the W&B project.
        entity: the team or user, or ``None`` (W&B's default).
        mode: ``online``, ``offline``, ``disabled`` or ``None`` (W&B's default).
        directory: where W&B writes its ``wandb/`` folder.
        study_name: the study's name (every run's group).
        study_key: text that tells this study from another of the same name (the storage's label).
        tags: tags of every run.
    """

    name = "wandb"

    def __init__(self, project: str, entity: str | None, mode: str | None, directory: str, study_name: str,
                 study_key: str, tags: list[str]) -> None:
        import wandb  # noqa: F401 - fails here, once, when wandb is missing

        self.project, self.entity, self.mode, self.dir = project, entity, mode, directory
        self.study_name = study_name
        self.tags = [str(t) for t in tags]
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", study_name).strip("-")[:40] or "study"
        self.prefix = f"{slug}-{hashlib.sha1(f'{study_key}|{study_name}'.encode()).hexdigest()[:8]}"

    def run_id(self, start: TrialStart) -> str:
        """``<study>-<hash>-t<run_key>``; a refit run: ``...-refit<number>-<unix time>`` (a new run each refit)."""
        if start.refit:
            return f"{self.prefix}-refit{start.refit_key}-{int(time.time())}"
        return f"{self.prefix}-t{start.run_key}"

    def trial_started(self, start: TrialStart) -> dict[str, str]:
        """The task's environment: W&B joins the trial's run (nothing is written before the trial ends)."""
        env = {"WANDB_RUN_ID": self.run_id(start), "WANDB_RESUME": "allow", "WANDB_PROJECT": self.project,
               "WANDB_RUN_GROUP": self.study_name, "WANDB_NAME": start.name, "WANDB_DIR": self.dir,
               "WANDB_JOB_TYPE": "refit" if start.refit else "trial", _NO_METADATA_ENV: "true"}
        if self.entity:
            env["WANDB_ENTITY"] = self.entity
        if self.mode:
            env["WANDB_MODE"] = self.mode
        return env

    def trial_ended(self, record: TrialRecord, env: dict[str, str]) -> None:
        """Write the record into the trial's run and finish it (exit code 1 for FAIL)."""
        import wandb

        start = record.start
        config: dict[str, Any] = {**redacted_params(start.params), "fixed_overrides": [redact(o) for o in start.fixed]}
        run = wandb.init(
            id=env["WANDB_RUN_ID"], project=self.project, entity=self.entity, group=self.study_name, name=start.name,
            job_type=env["WANDB_JOB_TYPE"], dir=self.dir, mode=self.mode, resume="allow", reinit="create_new",
            config=config, tags=self.tags, settings=wandb.Settings(silent=True, console="off", x_disable_meta=True),
        )
        try:
            run.define_metric("trial_step")
            run.define_metric("intermediate_value", step_metric="trial_step")
            for step, value in sorted(record.intermediate.items()):
                run.log({"trial_step": step, "intermediate_value": value})
            run.summary.update(record.final_metrics())
            run.summary.update({k.replace("ds_optuna.", "ds_optuna/"): v
                                for k, v in {**start_tags(start, self.study_name), **record.tags()}.items()})
        finally:
            run.finish(exit_code=1 if record.state == "FAIL" else 0)

    def close_study(self, status: str, best: Any = None) -> None:
        """At the sweep's end: wait until W&B has written every run (``wandb.teardown()``, W&B's documented
        "wait for W&B to finish"): ``run.finish()`` returns before W&B's service has written the run's file (an
        offline run's summary came about a second later), and a process that ends with ``os._exit``
        (``run_then_exit``) skips W&B's own teardown at exit. ``status`` and ``best`` are unused: W&B groups have
        no run."""
        import wandb

        wandb.teardown()

    def where(self) -> str:
        """Where the runs are: the project (online), or the offline run files and ``wandb sync``."""
        if self.mode == "offline":
            return f"W&B (offline): {self.dir}/wandb (upload with: wandb sync {self.dir}/wandb/offline-run-*)"
        return f"W&B: project '{self.project}', group '{redact(self.study_name)}'"
