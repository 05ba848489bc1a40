"""What rank 0 writes at the end: ``optimization_results.yaml``, ``trials.csv`` and the summary table; and its log
line for each finished trial (:func:`log_progress`: ``[k/n] Trial N STATE value ... in S s, params ...; best ...;
ETA``).

optuna is imported for type checking only.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from . import _pbt, _plots, _retry
from ._command import RerunContext, resume_command, trial_entry
from ._queue import continued_trials, continues
from ._stored import GPU_PEAK_ATTR, TRIAL_GROUP_ATTR, shown_state

if TYPE_CHECKING:
    import optuna
    from optuna.trial import TrialState

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"
#: One row per trial, written with the csv module beside the results (no pandas needed; case C49).
TRIALS_CSV = "trials.csv"


def summarize(
    study: "optuna.Study", ctx: RerunContext, directions: Sequence[str], budget: int | None = None
) -> dict[str, Any]:
    """The content of ``optimization_results.yaml``.

    Args:
        budget: ``hydra.sweeper.n_trials`` of this run (the study's total budget), written as
            ``n_trials_budget``; ``None`` leaves it out.

    Returns:
        A dict with ``name``, ``study_name``, ``directions``, ``trials_in_study`` (every trial the study
        holds, in any state; see :func:`trials_in_study`), ``n_trials_budget`` and counts per state
        (``states``); for one objective ``best_trial``, ``best_value``, ``best_params``,
        ``best_overrides`` (list), ``best_override_line`` (shell-quoted) and ``rerun_command`` (see
        :func:`trial_entry`); for several, ``pareto_front`` (one :func:`trial_entry` per
        Pareto-optimal trial) and ``solutions`` (``[{params, values}]``, as the official
        hydra-optuna-sweeper writes them). Best fields are absent when no trial completed. Under PBT, when the best
        model's weights came through a clone, ``best_schedule`` (:func:`._pbt.schedule`; the refit replays it).
    """
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    continued = continued_trials(trials)
    states = {s.name: 0 for s in TrialState}
    for t in trials:
        shown = shown_state(t.state.name, t.user_attrs, t.number in continued)  # INTERRUPTED apart from FAIL
        states[shown] = states.get(shown, 0) + 1
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
        schedule = _pbt.schedule(trials, entry["number"])
        if len(schedule) > 1:  # PBT: the best model's weights came through a clone, its params changed on the way
            out["best_schedule"] = schedule
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
    refits: Sequence[dict[str, Any]] = (), budget: int | None = None, stopped_by: Mapping[str, str] | None = None,
) -> Path:
    """Write ``<sweep_dir>/optimization_results.yaml`` and ``<sweep_dir>/trials.csv`` (rank 0 only) and
    log the summary.

    ``refits``: the refit runs' records (trial, state, overrides, metrics, rerun_command, job_dir),
    written under ``refit:``. ``budget``: as in :func:`summarize`. ``stopped_by``: the stop rule that ended the
    search (``{"rule": ..., "reason": ...}``, :mod:`._stop`), written under ``stopped_by:``. Long lines are not
    folded (a pasted rerun line lost its tail, case C19). Returns the path written.
    """
    import yaml

    summary = summarize(study, ctx, directions, budget)
    if stopped_by:
        summary["stopped_by"] = dict(stopped_by)
    if refits:
        summary["refit"] = list(refits)
    path = Path(sweep_dir) / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(summary, width=2**31 - 1, sort_keys=False, allow_unicode=True)
    _plots.atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))  # groups may share a sweep dir
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


def _value_columns(n_values: int) -> list[str]:
    return ["value"] if n_values == 1 else [f"values_{i}" for i in range(n_values)]


def trials_rows(study: "optuna.Study") -> list[dict[str, Any]]:
    """One dict per trial, in trial order, with the columns of ``trials.csv``. The columns follow Optuna's
    ``Study.trials_dataframe()`` (which needs pandas): ``number``, ``value`` (several objectives: ``values_0``,
    ``values_1``, ...), ``datetime_start``, ``datetime_complete``, ``duration_s`` (seconds), ``params_<name>``,
    ``user_attrs_<name>`` (the sweeper's own ``ds_optuna:`` attributes left out; lists and dicts as JSON),
    ``state``. A cell with nothing to say (a FAIL trial's value, a param the trial did not draw) is empty. When a
    trial continues another (a retry, an ASHA promotion, a PBT interval) or has a state Optuna does not name, two
    more: ``sweeper_state`` (:func:`._stored.shown_state`: PAUSED, PROMOTED, INTERRUPTED, NEVER_RAN, else
    Optuna's) and ``continues`` (the trial it continues).
    """
    trials = study.get_trials(deepcopy=False)
    continued = continued_trials(trials)
    shown = {t.number: shown_state(t.state.name, t.user_attrs, t.number in continued) for t in trials}
    parents = {t.number: continues(t) for t in trials}
    chains = any(parents[t.number] is not None or shown[t.number] != t.state.name for t in trials)
    value_cols = _value_columns(len(study.directions))
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
        if chains:
            parent = parents[t.number]
            row.update(sweeper_state=shown[t.number], continues="" if parent is None else parent)
        rows.append(row)
    return rows


def write_trials_csv(study: "optuna.Study", sweep_dir: str) -> Path:
    """Write ``<sweep_dir>/trials.csv`` (a whole file, replaced atomically): :func:`trials_rows` with a header
    line, via the csv module (a study without trials gives a header of the fixed columns only); return its path."""
    rows = trials_rows(study)
    header = list(rows[0]) if rows else ["number", *_value_columns(len(study.directions)), "datetime_start",
                                         "datetime_complete", "duration_s", "state"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path = Path(sweep_dir) / TRIALS_CSV
    _plots.atomic_write(path, lambda p: p.write_text(buf.getvalue(), encoding="utf-8"))
    return path


def summary_table(study: "optuna.Study", limit: int = 50) -> str:
    """A plain-text table of the study's trials (the last ``limit``): number, state, value(s),
    seconds, the trial group (when trials ran in trial groups, ``n_jobs`` under torchrun), rank 0's GPU peak
    in MiB (when any trial recorded one), params; best marked with ``*`` (the Pareto front's trials, with several
    objectives)."""
    from optuna.trial import TrialState

    every = study.get_trials(deepcopy=False)
    continued, trials = continued_trials(every), every[-limit:]
    best_numbers = set()
    try:  # one objective: the one trial ``best_trial`` names, as the results and the log line do, even on a tie
        best = study.best_trials if len(study.directions) > 1 else [study.best_trial]
        best_numbers = {t.number for t in best}
    except (ValueError, RuntimeError):
        pass
    gpu = any(GPU_PEAK_ATTR in t.user_attrs for t in trials)
    grouped = any(TRIAL_GROUP_ATTR in t.user_attrs for t in trials)
    rows = [("", "trial", "state", "value", "seconds", *(("group",) if grouped else ()), *(("GPU MiB",) if gpu else ()),
             "params")]
    for t in trials:
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        peak = t.user_attrs.get(GPU_PEAK_ATTR)
        rows.append(
            (
                "*" if t.number in best_numbers and t.state == TrialState.COMPLETE else "",
                str(t.number),
                shown_state(t.state.name, t.user_attrs, t.number in continued),
                ", ".join(f"{v:.6g}" for v in t.values) if t.values else "-",
                f"{seconds:.1f}" if seconds is not None else "-",
                *((str(t.user_attrs.get(TRIAL_GROUP_ATTR, "-")),) if grouped else ()),
                *((f"{peak / 2**20:.0f}" if peak is not None else "-",) if gpu else ()),
                " ".join(f"{k}={v!r}" for k, v in t.params.items()),
            )
        )
    n = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(n)) + "  " + r[n] for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def refit_table(refits: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of the refit runs (the records :func:`write_results` writes under ``refit:``): the run
    (``trial <n>`` or ``baseline <name>``), its state and every metric it returned, one column per metric name
    (``-`` where a run lacks it)."""
    names: list[str] = []
    for r in refits:
        names += [k for k in (r.get("metrics") or {}) if k not in names]
    rows = [("run", "state", *names)]
    for r in refits:
        metrics = r.get("metrics") or {}
        what = f"baseline {r['baseline']}" if r.get("baseline") else f"trial {r.get('trial')}"
        rows.append((what, str(r.get("state", "-")),
                     *(f"{metrics[k]:.6g}" if isinstance(metrics.get(k), (int, float)) else str(metrics.get(k, "-"))
                       for k in names)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(row[i].ljust(widths[i]) for i in range(len(row))).rstrip() for row in rows)


def finish_study(study: "optuna.Study", rerun: RerunContext, sweep_dir: str, directions: Sequence[str],
                 refits: Sequence[Mapping[str, Any]] = (), *, budget: int | None = None, plots: bool = True,
                 stopped_by: Mapping[str, str] | None = None) -> None:
    """The end of a sweep on rank 0: log the trials table, write the results (:func:`write_results`) and the
    plots. Never raises: an error is logged (a storage the retries gave up on, case C35, without a traceback
    and with the command that writes them later), so it never masks the sweep's own outcome."""
    try:
        log.info("Trials of study '%s':\n%s", study.study_name, summary_table(study))
        if refits:
            log.info("Refit runs of study '%s':\n%s", study.study_name, refit_table(refits))
        write_results(study, rerun, sweep_dir, directions, list(refits), budget=budget, stopped_by=stopped_by)
        if plots:
            _plots.write_plots(study, sweep_dir)
    except Exception:
        outage = _retry.gave_up(study)
        if outage is not None:
            log.error("Writing the results failed: %s. Once the storage answers again, the same command writes them "
                      "(a study that holds n_trials runs no new trial):\n%s", outage, resume_command(sweep_dir))
            return
        log.exception("Writing the results failed")


def finished_states(study: Any) -> dict[int, str]:
    """``{trial number: state}`` of the study's finished trials, ``INTERRUPTED`` for a preempted one
    (:func:`._stored.shown_state`), for closing tracker runs; ``{}`` when the storage cannot be read. Never raises."""
    try:
        trials = study.get_trials(deepcopy=False)
        continued = continued_trials(trials)
        return {t.number: shown_state(t.state.name, t.user_attrs, t.number in continued)
                for t in trials if t.state.is_finished()}
    except Exception:  # noqa: BLE001 - the storage is gone: the runs stay as they are
        return {}


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
