"""Rank 0's log line for each finished trial: ``[k/n] Trial N STATE value ... in S s, params ...; best ...; ETA``.

optuna is imported for type checking only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    import optuna
    from optuna.trial import TrialState

#: _results' logger: users filter by it.
log = logging.getLogger(__package__ + "._results")


def _best_text(study: "optuna.Study") -> str:
    if len(study.directions) > 1:
        return f"Pareto front of {len(study.best_trials)} trial(s)"
    try:
        best = study.best_trial
    except ValueError:  # no COMPLETE trial yet
        return "no completed trial yet"
    return f"best {best.value:.6g} (trial {best.number})"


def eta_s(busy_s: float, finished: int, left: int, groups: int, timeout_s: float | None,
          first_ask_at: float | None) -> float | None:
    """Seconds until the budget is spent: ``left`` trials at this run's mean seconds per finished trial
    (``busy_s / finished``) over the ``groups`` trial groups that run at once, at most what is left of
    ``hydra.sweeper.timeout`` since ``first_ask_at`` (``time.monotonic()``); ``None`` before any trial finished
    without a timeout."""
    eta = busy_s / finished * left / groups if finished else None
    if timeout_s is not None and first_ask_at is not None:  # no ask after the timeout
        time_left = max(timeout_s - (time.monotonic() - first_ask_at), 0.0)
        eta = time_left if eta is None else min(eta, time_left)
    return eta


@dataclass(frozen=True)
class Progress:
    """Where the sweep stands after a trial, for its log line.

    Attributes:
        done: trials counted against the budget now (``_queue.counted_trials``).
        budget: ``n_trials``.
        eta_s: seconds left at this run's mean seconds per finished trial, or ``None`` (unknown).
    """

    done: int
    budget: int
    eta_s: float | None = None

    def eta_text(self) -> str:
        """``"ETA 3 min 20 s"``, or ``""`` when unknown."""
        if self.eta_s is None:
            return ""
        minutes, seconds = divmod(int(round(self.eta_s)), 60)
        return "ETA " + (f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s")


@dataclass(frozen=True)
class TrialReport:
    """What rank 0's log line says about one finished trial (:func:`log_progress`).

    Attributes:
        state: the state told to the study.
        values: the objective value(s), or ``None``.
        seconds: wall-clock seconds from ask to verdict.
        error: the failing ranks' errors, or ``None``.
        progress: where the sweep stands (budget, ETA), or ``None``.
        gpu_peak_bytes: rank 0's peak allocated GPU memory in bytes, or ``None`` (no CUDA).
        group: the trial group that ran it (``hydra.sweeper.n_jobs`` inside a torchrun world), or ``None``.
        interrupted: the trial stopped on ``should_preempt()`` (stored FAIL, shown INTERRUPTED, re-queued).
        paused: it stopped at its ASHA rung (stored PRUNED, shown PAUSED).
    """

    number: int
    params: Mapping[str, Any]
    state: "TrialState"
    values: Sequence[float] | None
    seconds: float
    error: str | None = None
    progress: Progress | None = None
    gpu_peak_bytes: int | None = None
    group: int | None = None
    interrupted: bool = False
    paused: bool = False


def log_progress(study: "optuna.Study", report: TrialReport) -> None:
    """Log one line for a finished trial on rank 0: ``k/n``, number (and trial group), state, value(s), params,
    seconds, best so far, the ETA (``report.progress``) and rank 0's peak GPU memory when CUDA was used."""
    r, progress = report, report.progress
    value_text = "" if r.values is None else " value " + ", ".join(f"{v:.6g}" for v in r.values)
    if r.gpu_peak_bytes is not None:
        value_text += f", GPU peak {r.gpu_peak_bytes / 2**20:.0f} MiB"
    error_text = f" ({r.error})" if r.error else ""
    log.info(
        "%sTrial %d%s %s%s in %.1f s, params %s%s; %s%s",
        f"[{progress.done}/{progress.budget}] " if progress else "",
        r.number,
        f" (group {r.group})" if r.group is not None else "",
        "INTERRUPTED" if r.interrupted else "PAUSED" if r.paused else r.state.name,
        value_text,
        r.seconds,
        dict(r.params),
        error_text,
        _best_text(study),
        f"; {progress.eta_text()}" if progress and progress.eta_s is not None else "",
    )
