"""What rank 0 reports: a log line per trial, and ``optimization_results.yaml`` in the sweep dir.

optuna is imported for type checking only.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from omegaconf import OmegaConf

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial, TrialState

    from ._search_space import SearchSpace

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"


def _best_text(study: "optuna.Study") -> str:
    if len(study.directions) > 1:
        return f"Pareto front of {len(study.best_trials)} trial(s)"
    try:
        best = study.best_trial
    except ValueError:  # no COMPLETE trial yet
        return "no completed trial yet"
    return f"best {best.value:.6g} (trial {best.number})"


def log_progress(
    study: "optuna.Study",
    number: int,
    params: Mapping[str, Any],
    state: "TrialState",
    values: Sequence[float] | None,
    seconds: float,
    error: str | None = None,
) -> None:
    """Log one line for a finished trial on rank 0: number, state, value(s), params, seconds, best so far."""
    value_text = "" if values is None else " value " + ", ".join(f"{v:.6g}" for v in values)
    error_text = f" ({error})" if error else ""
    log.info(
        "Trial %d %s%s in %.1f s, params %s%s; %s",
        number,
        state.name,
        value_text,
        seconds,
        dict(params),
        error_text,
        _best_text(study),
    )


def rerun_overrides(space: "SearchSpace | None", params: Mapping[str, Any]) -> list[str]:
    """The override list that reruns a trial's config: fixed overrides, then its params."""
    if space is None:
        return [f"{k}={v}" for k, v in params.items()]
    return space.overrides(params)


def app_command() -> str:
    """How the running app was started, for rerun lines: the script path relative to the working
    directory (``examples/train.py``), or ``<your app>.py`` when unknown."""
    script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else ""
    if not script:
        return "<your app>.py"
    try:
        return os.path.relpath(script)
    except ValueError:
        return script


def _trial_entry(trial: "FrozenTrial", space: "SearchSpace | None") -> dict[str, Any]:
    overrides = rerun_overrides(space, trial.params)
    return {
        "number": trial.number,
        "values": list(trial.values),
        "params": dict(trial.params),
        "overrides": overrides,
        "override_line": " ".join(shlex.quote(o) for o in overrides),
    }


def summarize(study: "optuna.Study", space: "SearchSpace | None", directions: Sequence[str]) -> dict[str, Any]:
    """The content of ``optimization_results.yaml``.

    Returns:
        A dict with ``name``, ``study_name``, ``directions``, ``n_trials`` and counts per state
        (``states``); for one objective ``best_trial``, ``best_value``, ``best_params``,
        ``best_overrides`` (list) and ``best_override_line`` (shell-quoted, to append to
        ``python <app>.py``); for several, ``pareto_front``: one entry per Pareto-optimal trial with
        its values, params and override line. Best fields are absent when no trial completed.
    """
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    states = {s.name: 0 for s in TrialState}
    for t in trials:
        states[t.state.name] += 1
    out: dict[str, Any] = {
        "name": "ds_optuna",
        "study_name": study.study_name,
        "directions": list(directions),
        "n_trials": len(trials),
        "states": {k: v for k, v in states.items() if v},
    }
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        return out
    if len(directions) == 1:
        best = study.best_trial
        entry = _trial_entry(best, space)
        out.update(
            best_trial=best.number,
            best_value=best.value,
            best_params=entry["params"],
            best_overrides=entry["overrides"],
            best_override_line=entry["override_line"],
            rerun_command=f"python {app_command()} {entry['override_line']}".rstrip(),
        )
    else:
        out["pareto_front"] = [_trial_entry(t, space) for t in study.best_trials]
    return out


def write_results(
    study: "optuna.Study", space: "SearchSpace | None", sweep_dir: str, directions: Sequence[str]
) -> Path:
    """Write ``<sweep_dir>/optimization_results.yaml`` (rank 0 only) and log the summary.

    Returns:
        The path written.
    """
    summary = summarize(study, space, directions)
    path = Path(sweep_dir) / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    # Several torchrun groups sharing a study may share a sweep dir: write whole files only.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    OmegaConf.save(OmegaConf.create(summary), tmp)
    os.replace(tmp, path)
    if "best_value" in summary:
        log.info(
            "Best trial %d: value %.6g, params %s\n  rerun: %s",
            summary["best_trial"],
            summary["best_value"],
            summary["best_params"],
            summary["rerun_command"],
        )
    log.info("Trials by state: %s; results in %s", summary["states"], path)
    return path


def summary_table(study: "optuna.Study", limit: int = 50) -> str:
    """A plain-text table of the study's trials (the last ``limit``): number, state, value(s),
    seconds, params; best first line marked with ``*``."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)[-limit:]
    best_numbers = set()
    try:
        best_numbers = {t.number for t in study.best_trials}
    except (ValueError, RuntimeError):
        pass
    rows = [("", "trial", "state", "value", "seconds", "params")]
    for t in trials:
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        rows.append(
            (
                "*" if t.number in best_numbers and t.state == TrialState.COMPLETE else "",
                str(t.number),
                t.state.name,
                ", ".join(f"{v:.6g}" for v in t.values) if t.values else "-",
                f"{seconds:.1f}" if seconds is not None else "-",
                " ".join(f"{k}={v!r}" for k, v in t.params.items()),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]
    return "\n".join(line.rstrip() for line in lines)
