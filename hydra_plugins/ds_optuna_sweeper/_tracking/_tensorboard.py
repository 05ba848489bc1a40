"""TensorBoard: one event dir per trial, ``<log_dir>/trial_<number>``, with the trial's intermediate values, its
final value and its params (TensorBoard's HPARAMS tab), written with ``torch.utils.tensorboard`` by the rank that
owns the study. The task's own TensorBoard logging writes into the same dir (:mod:`._task_env`); TensorBoard shows
every event file of a dir as one run.
"""

from __future__ import annotations

from pathlib import Path

from ._record import TrialRecord, TrialStart, redact, redacted_params

#: The environment variable transformers' ``TensorBoardCallback`` takes its log dir from (transformers 5).
LOG_DIR_ENV = "TENSORBOARD_LOGGING_DIR"


class TensorboardTracker:
    """Event dirs below ``root``, one per trial (a retry that resumes writes into its first attempt's dir).

    Args:
        root: the parent dir (created).
        study_name: the study's name (a text summary of each run).
    """

    name = "tensorboard"

    def __init__(self, root: str, study_name: str) -> None:
        import torch.utils.tensorboard  # noqa: F401 - fails here, once, when tensorboard is missing

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.study_name = study_name

    def run_dir(self, start: TrialStart) -> Path:
        """``<root>/trial_<run_key>``, or ``<root>/refit_<number>`` for a refit run."""
        return self.root / (f"refit_{start.refit_key}" if start.refit else f"trial_{start.run_key}")

    def trial_started(self, start: TrialStart) -> dict[str, str]:
        """Create the trial's event dir; the task's environment names it."""
        path = self.run_dir(start)
        path.mkdir(parents=True, exist_ok=True)
        return {LOG_DIR_ENV: str(path)}

    def trial_ended(self, record: TrialRecord, env: dict[str, str]) -> None:
        """Write the record's scalars, its params with the final metrics (HPARAMS), and its tags as text."""
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        writer = SummaryWriter(log_dir=env[LOG_DIR_ENV])
        try:
            for step, value in sorted(record.intermediate.items()):
                writer.add_scalar("intermediate_value", value, step)
            last = max(record.intermediate, default=0)
            final = record.final_metrics()
            for key, value in final.items():
                writer.add_scalar(key, value, last)
            if not record.start.refit:
                params = {k: v if isinstance(v, (int, float, str, bool)) else str(v)  # what the HPARAMS plugin takes
                          for k, v in redacted_params(record.start.params).items()}
                for summary in hparams(params, final or {"duration_s": 0.0}):
                    writer.file_writer.add_summary(summary)
            tags = {"ds_optuna.study": self.study_name, **record.tags()}
            writer.add_text("ds_optuna", "\n\n".join(f"**{k}**: {redact(v)}" for k, v in tags.items()), last)
        finally:
            writer.close()

    def where(self) -> str:
        """How to look: the ``tensorboard`` command."""
        return f"TensorBoard: tensorboard --logdir {self.root}"

