"""What the trackers write for a trial: :class:`TrialStart` when it is asked, :class:`TrialRecord` when it ends.

Built on the rank that owns the study from the study itself (the stored trial) and the agreed verdict, so
every tracker writes the same facts. Every text passes :func:`redact` first: a storage URL's password never
reaches a tracker. Only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .._secrets import redact  # the one rule (also for the .hydra files Hydra writes per job)


def redacted_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with :func:`redact` applied to the text values (numbers and booleans keep their type)."""
    return {k: redact(v) if isinstance(v, str) else v for k, v in params.items()}


@dataclass(frozen=True)
class TrialStart:
    """A trial (or a refit run) that starts: what its run is created with.

    Attributes:
        number: the Optuna trial number.
        run_key: the trial whose run this attempt writes to: ``number``, or for a retry that resumes from a
            checkpoint the first attempt's number (``checkpoints``: the retry continues its run).
        params: ``{param name: value}`` sampled on rank 0 (the override params; typed: float, int, str, bool).
        fixed: the fixed overrides of the run (``key=value`` lines), the same for every trial.
        group: the trial group that runs it (``n_jobs`` inside a torchrun world), or ``None``.
        refit: a refit run of trial ``number`` (its run is its own, tagged as a refit).
        written_steps: steps whose intermediate values the run holds already (those a retry inherited from the
            attempt it continues); they are not written again.
        baseline: the name of a ``refit.baselines`` config (a refit run that is no trial; ``number`` is negative).
    """

    number: int
    run_key: int
    params: dict[str, Any] = field(default_factory=dict)
    fixed: tuple[str, ...] = ()
    group: Optional[int] = None
    refit: bool = False
    written_steps: tuple[int, ...] = ()
    baseline: str = ""

    @property
    def refit_key(self) -> str:
        """What names a refit run: the trial number, or the baseline's name."""
        return self.baseline or str(self.number)

    @property
    def name(self) -> str:
        """The run's name: ``trial-<run_key>`` or ``refit-<number or baseline name>``."""
        return f"refit-{self.refit_key}" if self.refit else f"trial-{self.run_key}"

    @property
    def display_name(self) -> str:
        """The MLflow run's name for this attempt: :attr:`name`, or ``trial-<number> (resumes trial-<run_key>)`` for
        a retry that continues the run of the attempt it resumes (issue 38, C59: the retry's result was shown under
        the interrupted trial's name)."""
        if self.refit or self.run_key == self.number:
            return self.name
        return f"trial-{self.number} (resumes trial-{self.run_key})"


@dataclass(frozen=True)
class TrialRecord:
    """A trial (or refit run) that ended, as told to the study.

    Attributes:
        start: how it started.
        state: ``COMPLETE``, ``PRUNED``, ``FAIL`` or ``INTERRUPTED`` (preempted; its retry continues the run).
        values: the objective values of a COMPLETE trial (one per direction), else ``()``.
        intermediate: ``{step: value}`` the task reported, without the steps a retried attempt already wrote.
        duration_s: seconds from ask to tell (Optuna's ``datetime_complete - datetime_start``), or ``None``.
        pruned_at: the step it was pruned at (its last reported step), or ``None``.
        error: the agreed failure message (redacted), or ``None``.
        rerun: the shell line that reruns its config (redacted), or ``""``.
        metrics: a refit run's ``{name: number}`` metrics.
    """

    start: TrialStart
    state: str
    values: tuple[float, ...] = ()
    intermediate: dict[int, float] = field(default_factory=dict)
    duration_s: Optional[float] = None
    pruned_at: Optional[int] = None
    error: Optional[str] = None
    rerun: str = ""
    metrics: dict[str, float] = field(default_factory=dict)

    def final_metrics(self) -> dict[str, float]:
        """The run's final metrics: ``value`` (one objective) or ``values_<i>`` (Optuna's names), the refit's
        metrics, and ``duration_s``."""
        out: dict[str, float] = {}
        if len(self.values) == 1:
            out["value"] = float(self.values[0])
        else:
            out.update({f"values_{i}": float(v) for i, v in enumerate(self.values)})
        out.update({str(k): float(v) for k, v in self.metrics.items() if _is_number(v)})
        if self.duration_s is not None:
            out["duration_s"] = float(self.duration_s)
        return out

    def tags(self) -> dict[str, str]:
        """The run's ``ds_optuna.*`` tags for its end: state, pruned-at step, error, rerun line (all redacted)."""
        tags = {"ds_optuna.state": self.state}
        if self.pruned_at is not None:
            tags["ds_optuna.pruned_at_step"] = str(self.pruned_at)
        if self.error:
            tags["ds_optuna.error"] = redact(self.error)[:4000]
        if self.rerun:
            tags["ds_optuna.rerun"] = redact(self.rerun)[:4000]
        return tags


def trial_record(start: TrialStart, trial: Any, state: str, *, error: Optional[str] = None, rerun: str = "",
                 elapsed_s: Optional[float] = None) -> TrialRecord:
    """The :class:`TrialRecord` of a trial told to the study.

    Args:
        start: how its run started.
        trial: the stored ``optuna.trial.FrozenTrial`` after the tell (values, intermediate values, times).
        state: the state name to record (``INTERRUPTED`` for a preempted trial, else ``trial.state.name``).
        error: the agreed failure message, if any.
        rerun: its rerun line.
        elapsed_s: seconds from ask to tell on rank 0, used when the stored trial has no duration.
    """
    steps = {int(s): float(v) for s, v in trial.intermediate_values.items() if int(s) not in start.written_steps}
    duration = trial.duration.total_seconds() if trial.duration is not None else elapsed_s
    values = tuple(float(v) for v in trial.values) if state == "COMPLETE" and trial.values else ()
    pruned_at = max(trial.intermediate_values, default=None) if state == "PRUNED" else None
    return TrialRecord(start, state, values, steps, duration, pruned_at, error, rerun)


def start_tags(start: TrialStart, study_name: str) -> dict[str, str]:
    """The ``ds_optuna.*`` tags a run gets when it starts: study, trial, group, refit, fixed overrides."""
    tags = {"ds_optuna.study": study_name, "ds_optuna.trial": str(start.run_key), "ds_optuna.state": "RUNNING"}
    if start.run_key != start.number:
        tags["ds_optuna.resumed_by_trial"] = str(start.number)
    if start.group is not None:
        tags["ds_optuna.trial_group"] = str(start.group)
    if start.refit:
        tags["ds_optuna.refit"] = "true"
        tags["ds_optuna.trial"] = str(start.number)
        if start.baseline:
            tags["ds_optuna.baseline"] = start.baseline
            del tags["ds_optuna.trial"]
    if start.fixed:
        tags["ds_optuna.fixed_overrides"] = redact(" ".join(start.fixed))[:4000]
    return tags


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class StudyBest:
    """The study's best trial(s) when the sweep ends, for the study's parent run (issue 38, C59).

    Attributes:
        numbers: the best trials' numbers (one for a single objective; the Pareto front's otherwise).
        values: the first best trial's objective values.
        params: the first best trial's params.
    """

    numbers: tuple[int, ...]
    values: tuple[float, ...]
    params: dict[str, Any]

    @classmethod
    def of(cls, study: Any) -> Optional["StudyBest"]:
        """The best of ``study`` (an ``optuna.Study``), or ``None`` without a COMPLETE trial or a storage that
        does not answer (never raises: tracking never fails the sweep)."""
        try:
            best = list(study.best_trials)
        except Exception:  # noqa: BLE001 - no complete trial (ValueError), or the storage is gone
            return None
        if not best or best[0].values is None:
            return None
        return cls(tuple(t.number for t in best), tuple(float(v) for v in best[0].values), dict(best[0].params))
