"""Optuna's plots of the study, written by rank 0 into ``<sweep dir>/plots/`` as PNG and HTML.

PNG through ``optuna.visualization.matplotlib`` (Agg backend, no display needed), HTML through
``optuna.visualization`` (plotly); plotting never fails the sweep. optuna, matplotlib and plotly are imported
inside functions: a sweep without plots never loads them.
"""

import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

PLOTS_DIR = "plots"


def _plots_for(study: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{file stem: (optuna plot function name, kwargs)}`` that make sense for this study."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    multi = len(study.directions) > 1
    plots: dict[str, tuple[str, dict[str, Any]]] = {}
    if multi:
        plots["pareto_front"] = ("plot_pareto_front", {})
        target = {"target": lambda t: t.values[0], "target_name": "objective 0"}
    else:
        target = {}
    plots["optimization_history"] = ("plot_optimization_history", dict(target))
    if len(complete) >= 2 and any(t.params for t in complete):
        plots["param_importances"] = ("plot_param_importances", dict(target))
        plots["parallel_coordinate"] = ("plot_parallel_coordinate", dict(target))
    if any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        plots["intermediate_values"] = ("plot_intermediate_values", {})
    return plots


def write_plots(study: Any, sweep_dir: str) -> list[Path]:
    """Write each applicable plot as ``<name>.png`` and ``<name>.html`` under ``<sweep_dir>/plots``; return the
    files written. Plots that fail (too few trials, a missing optional package) are skipped and named in the log;
    nothing is raised."""
    from optuna.trial import TrialState

    out = Path(sweep_dir) / PLOTS_DIR
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        log.info("Plots skipped: no COMPLETE trial yet")
        return []
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    skipped: dict[str, list[str]] = {}  # reason -> file names, for one log line
    for stem, (fn_name, kwargs) in _plots_for(study).items():
        for kind, writer in (("png", _write_png), ("html", _write_html)):
            path = out / f"{stem}.{kind}"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # experimental-API and few-trials warnings
                    writer(fn_name, study, kwargs, path)
                written.append(path)
            except Exception as e:  # never fail the sweep over a plot
                first = (str(e).strip().splitlines() or [""])[0]
                skipped.setdefault(f"{type(e).__name__}: {first}".rstrip(": "), []).append(path.name)
    if skipped:
        log.info("Plots skipped: %s", skipped_text(skipped))
    if written:
        log.info("Plots written to %s: %s", out, sorted(p.name for p in written))
    return written


def skipped_text(skipped: dict[str, list[str]]) -> str:
    """One line for ``skipped`` (``{reason: [file name, ...]}``): ``a.png, b.png (ModuleNotFoundError: ...);
    c.html (...)``, with ``pip install 'hydra-ds-optuna-sweeper[plots]'`` when matplotlib or plotly is missing."""
    parts = []
    for reason, names in skipped.items():
        hint = "; pip install 'hydra-ds-optuna-sweeper[plots]'" if ("matplotlib" in reason or "plotly" in reason) else ""
        parts.append(f"{', '.join(names)} ({reason}{hint})")
    return "; ".join(parts)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` a hidden temporary file beside ``path`` (same suffix), then rename it: readers see whole files."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}{path.suffix}")
    write(tmp)
    os.replace(tmp, path)


def _write_png(fn_name: str, study: Any, kwargs: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as ovm

    ax = getattr(ovm, fn_name)(study, **kwargs)
    fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
    try:
        fig.set_size_inches(9, 6)
        atomic_write(path, lambda p: fig.savefig(p, dpi=100, bbox_inches="tight"))
    finally:
        plt.close(fig)


def _write_html(fn_name: str, study: Any, kwargs: dict[str, Any], path: Path) -> None:
    import optuna.visualization as ov

    # "directory": one plotly.min.js beside the pages, so they open offline without a 3.5 MB copy each.
    fig = getattr(ov, fn_name)(study, **kwargs)
    atomic_write(path, lambda p: fig.write_html(str(p), include_plotlyjs="directory"))
