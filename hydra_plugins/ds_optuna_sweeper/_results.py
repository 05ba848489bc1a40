"""What rank 0 reports: a log line per trial, and ``optimization_results.yaml`` in the sweep dir.

optuna is imported for type checking only.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ._command import rerun_line
from ._trial import REPLAY_ENV

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial, TrialState

    from ._search_space import SearchSpace

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"
#: One row per trial, written with the csv module beside the results (no pandas needed; case C49).
TRIALS_CSV = "trials.csv"


def _best_text(study: "optuna.Study") -> str:
    if len(study.directions) > 1:
        return f"Pareto front of {len(study.best_trials)} trial(s)"
    try:
        best = study.best_trial
    except ValueError:  # no COMPLETE trial yet
        return "no completed trial yet"
    return f"best {best.value:.6g} (trial {best.number})"


@dataclass(frozen=True)
class Progress:
    """Where the sweep stands after a trial, for its log line.

    Attributes:
        done: trials counted against the budget now (``_study.counted_trials``).
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


def log_progress(
    study: "optuna.Study",
    number: int,
    params: Mapping[str, Any],
    state: "TrialState",
    values: Sequence[float] | None,
    seconds: float,
    error: str | None = None,
    progress: Progress | None = None,
    gpu_peak_bytes: int | None = None,
) -> None:
    """Log one line for a finished trial on rank 0: ``k/n``, number, state, value(s), params, seconds,
    best so far, the ETA (``progress``) and rank 0's peak GPU memory when CUDA was used."""
    value_text = "" if values is None else " value " + ", ".join(f"{v:.6g}" for v in values)
    if gpu_peak_bytes is not None:
        value_text += f", GPU peak {gpu_peak_bytes / 2**20:.0f} MiB"
    error_text = f" ({error})" if error else ""
    log.info(
        "%sTrial %d %s%s in %.1f s, params %s%s; %s%s",
        f"[{progress.done}/{progress.budget}] " if progress else "",
        number,
        state.name,
        value_text,
        seconds,
        dict(params),
        error_text,
        _best_text(study),
        f"; {progress.eta_text()}" if progress and progress.eta_s is not None else "",
    )


#: Trial user attribute with rank 0's peak allocated GPU memory in bytes (``trial_scope`` on CUDA).
GPU_PEAK_ATTR = "gpu_peak_allocated_bytes"

#: Trial user attribute listing the params that ``custom_search_space`` added as config overrides.
OVERRIDE_PARAMS_ATTR = "ds_optuna:override_params"


@dataclass(frozen=True)
class RerunContext:
    """What a rerun line needs besides the trial: the search space and the run's Hydra overrides.

    Attributes:
        space: the search space (fixed overrides and the params that are overrides).
        hydra_overrides: the sweep's ``hydra.*`` command-line overrides (the sweep's own are dropped
            from rerun lines).
    """

    space: "SearchSpace | None"
    hydra_overrides: tuple[str, ...] = ()
    #: the sweep dir: a trial's rerun line runs in ``<sweep_dir>/rerun/<trial>`` (``""``: Hydra's default).
    sweep_dir: str = ""


def split_params(trial: "FrozenTrial", space: "SearchSpace | None") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(override params, task params)``: params that are config overrides (the search space's and
    those ``custom_search_space`` added) and params the task suggested itself (``suggest_*``)."""
    names = set(space.params) if space is not None else set(trial.params)
    names |= set(trial.user_attrs.get(OVERRIDE_PARAMS_ATTR, ()))
    overrides = {k: v for k, v in trial.params.items() if k in names}
    return overrides, {k: v for k, v in trial.params.items() if k not in names}


#: Trial user attribute: the fixed overrides of the run that asked the trial (a later run of the
#: study may have others; the trial's rerun line must use its own).
FIXED_OVERRIDES_ATTR = "ds_optuna:fixed_overrides"


def trial_overrides(trial: "FrozenTrial", space: "SearchSpace | None") -> tuple[list[str], dict[str, Any]]:
    """``(override lines, task params)`` that reproduce ``trial``: the fixed overrides of the run that
    asked it (stored with the trial; the current run's for trials stored without them), then its
    params that are overrides; and the params the task suggested itself."""
    override_params, task_params = split_params(trial, space)
    if space is None:
        return [f"{k}={v}" for k, v in override_params.items()], task_params
    fixed = trial.user_attrs.get(FIXED_OVERRIDES_ATTR, space.fixed)
    return [*fixed, *space.param_lines(override_params)], task_params


def trial_entry(trial: "FrozenTrial", ctx: RerunContext) -> dict[str, Any]:
    """One trial for ``optimization_results.yaml``: number, values, params, overrides and the rerun line.

    ``rerun_command`` runs the trial's config once, in the same world (launcher as the sweep was
    launched), with the same primary config and fixed overrides; params the task suggested itself
    travel in ``DS_OPTUNA_TRIAL``, which :func:`~hydra_plugins.ds_optuna_sweeper.current_trial` replays
    (case C19).
    """
    overrides, task_params = trial_overrides(trial, ctx.space)
    env = {REPLAY_ENV: json.dumps({"number": trial.number, "params": task_params})} if task_params else None
    return {
        "number": trial.number,
        "values": list(trial.values),
        "params": dict(trial.params),
        "overrides": overrides,
        "override_line": " ".join(shlex.quote(o) for o in overrides),
        "rerun_command": rerun_line(overrides, ctx.hydra_overrides, env,
                                    run_dir=rerun_dir(ctx.sweep_dir, trial.number) if ctx.sweep_dir else None),
    }


def rerun_dir(sweep_dir: str, number: int, *, refit: bool = False) -> str:
    """Where a rerun line runs: ``<sweep dir>/rerun/<trial>`` (a refit's: ``<sweep dir>/rerun/refit-<trial>``),
    one dir for every rank (case C49)."""
    return str(Path(sweep_dir) / "rerun" / (f"refit-{number}" if refit else str(number)))


def summarize(
    study: "optuna.Study", ctx: RerunContext, directions: Sequence[str], budget: int | None = None
) -> dict[str, Any]:
    """The content of ``optimization_results.yaml``.

    Args:
        budget: ``hydra.sweeper.n_trials`` of this run (the study's total budget), written as
            ``n_trials_budget``; ``None`` leaves it out.

    Returns:
        A dict with ``name``, ``study_name``, ``directions``, ``trials_in_study`` (every trial the study
        holds, in any state; files written before case C49 called it ``n_trials``, see
        :func:`trials_in_study`), ``n_trials_budget`` and counts per state
        (``states``); for one objective ``best_trial``, ``best_value``, ``best_params``,
        ``best_overrides`` (list), ``best_override_line`` (shell-quoted) and ``rerun_command`` (see
        :func:`trial_entry`); for several, ``pareto_front`` (one :func:`trial_entry` per
        Pareto-optimal trial) and ``solutions`` (``[{params, values}]``, as the official
        hydra-optuna-sweeper writes them). Best fields are absent when no trial completed.
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
        "trials_in_study": len(trials),
        **({"n_trials_budget": int(budget)} if budget is not None else {}),
        "states": {k: v for k, v in states.items() if v},
    }
    if not any(t.state == TrialState.COMPLETE for t in trials):
        return out
    if len(directions) == 1:
        entry = trial_entry(study.best_trial, ctx)
        out.update(
            best_trial=entry["number"],
            best_value=entry["values"][0],
            best_params=entry["params"],
            best_overrides=entry["overrides"],
            best_override_line=entry["override_line"],
            rerun_command=entry["rerun_command"],
        )
    else:
        front = [trial_entry(t, ctx) for t in study.best_trials]
        out["pareto_front"] = front
        out["solutions"] = [{"params": e["params"], "values": e["values"]} for e in front]
    return out


def trials_in_study(results: Mapping[str, Any]) -> int | None:
    """The number of trials a loaded results file says the study holds: ``trials_in_study``, or
    ``n_trials`` in a file written before case C49 (where it meant the same count); ``None`` if absent."""
    value = results.get("trials_in_study", results.get("n_trials"))
    return None if value is None else int(value)


def write_results(
    study: "optuna.Study", ctx: RerunContext, sweep_dir: str, directions: Sequence[str],
    refits: Sequence[dict[str, Any]] = (), budget: int | None = None,
) -> Path:
    """Write ``<sweep_dir>/optimization_results.yaml`` and ``<sweep_dir>/trials.csv`` (rank 0 only) and
    log the summary.

    ``refits``: the refit runs' records (trial, state, overrides, metrics, rerun_command, job_dir),
    written under ``refit:``. ``budget``: as in :func:`summarize`.

    Long lines stay on one line (a YAML dump folds strings at 80 columns by default, and a pasted
    rerun line then lost its tail, case C19).

    Returns:
        The path written.
    """
    import yaml

    summary = summarize(study, ctx, directions, budget)
    if refits:
        summary["refit"] = list(refits)
    path = Path(sweep_dir) / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    # Several torchrun groups sharing a study may share a sweep dir: write whole files only.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump(summary, width=2**31 - 1, sort_keys=False, allow_unicode=True))
    os.replace(tmp, path)
    write_trials_csv(study, sweep_dir)
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


def trials_rows(study: "optuna.Study") -> list[dict[str, Any]]:
    """One dict per trial, in trial order, with the columns of ``trials.csv``.

    The columns follow Optuna's ``Study.trials_dataframe()`` (which needs pandas): ``number``,
    ``value`` (several objectives: ``values_0``, ``values_1``, ...), ``datetime_start``,
    ``datetime_complete``, ``duration_s`` (seconds), ``params_<name>``, ``user_attrs_<name>``
    (the sweeper's own ``ds_optuna:`` attributes left out; lists and dicts as JSON), ``state``. A
    cell with nothing to say (a FAIL trial's value, a param the trial did not draw) is empty.
    """
    trials = study.get_trials(deepcopy=False)
    n_values = len(study.directions)
    value_cols = ["value"] if n_values == 1 else [f"values_{i}" for i in range(n_values)]
    params = list(dict.fromkeys(k for t in trials for k in t.params))
    attrs = list(dict.fromkeys(k for t in trials for k in t.user_attrs if not k.startswith("ds_optuna:")))
    rows = []
    for t in trials:
        start, end = t.datetime_start, t.datetime_complete
        row: dict[str, Any] = {"number": t.number}
        row.update({c: (t.values[i] if t.values else "") for i, c in enumerate(value_cols)})
        row.update(
            datetime_start=start.isoformat(sep=" ") if start else "",
            datetime_complete=end.isoformat(sep=" ") if end else "",
            duration_s=f"{(end - start).total_seconds():.3f}" if start and end else "",
        )
        row.update({f"params_{k}": t.params.get(k, "") for k in params})
        for k in attrs:
            v = t.user_attrs.get(k, "")
            row[f"user_attrs_{k}"] = json.dumps(v) if isinstance(v, (list, dict)) else v
        row["state"] = t.state.name
        rows.append(row)
    return rows


def write_trials_csv(study: "optuna.Study", sweep_dir: str) -> Path:
    """Write ``<sweep_dir>/trials.csv``: :func:`trials_rows` with a header line, via the csv module.

    Returns:
        The path written (a whole file, replaced atomically; a study without trials gives a header of
        the fixed columns only).
    """
    rows = trials_rows(study)
    n_values = len(study.directions)
    header = list(rows[0]) if rows else ["number", *(["value"] if n_values == 1 else
                                                       [f"values_{i}" for i in range(n_values)]),
                                          "datetime_start", "datetime_complete", "duration_s", "state"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path = Path(sweep_dir) / TRIALS_CSV
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(buf.getvalue(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def summary_table(study: "optuna.Study", limit: int = 50) -> str:
    """A plain-text table of the study's trials (the last ``limit``): number, state, value(s),
    seconds, rank 0's GPU peak in MiB (when any trial recorded one), params; best marked with ``*``."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)[-limit:]
    best_numbers = set()
    try:
        best_numbers = {t.number for t in study.best_trials}
    except (ValueError, RuntimeError):
        pass
    gpu = any(GPU_PEAK_ATTR in t.user_attrs for t in trials)
    rows = [("", "trial", "state", "value", "seconds", *(("GPU MiB",) if gpu else ()), "params")]
    for t in trials:
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        peak = t.user_attrs.get(GPU_PEAK_ATTR)
        rows.append(
            (
                "*" if t.number in best_numbers and t.state == TrialState.COMPLETE else "",
                str(t.number),
                t.state.name,
                ", ".join(f"{v:.6g}" for v in t.values) if t.values else "-",
                f"{seconds:.1f}" if seconds is not None else "-",
                *((f"{peak / 2**20:.0f}" if peak is not None else "-",) if gpu else ()),
                " ".join(f"{k}={v!r}" for k, v in t.params.items()),
            )
        )
    n = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(n)) + "  " + r[n] for r in rows]
    return "\n".join(line.rstrip() for line in lines)
