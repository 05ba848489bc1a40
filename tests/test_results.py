"""What a sweep leaves for people: optimization_results.yaml with a working rerun line, Pareto
front, plots, the per-trial log lines and the summary table.

In process at world size 1 (``tests/in_process.py``, issue 39 item 1): rank 0 alone writes all of it. The
rerun line of a 2-rank sweep (``--nproc_per_node 2``) is ``tests/test_command.py``'s and
``tests/multirank/test_refit.py::test_c19_c49_*``'s.
"""

import shlex

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.torchrun_utils import REPO

from tests.in_process import sweep
from tests.multirank.sweep_helpers import load, records


def test_best_overrides_compose_back_to_the_best_trials_config(tmp_path):
    res = sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "y=range(1,3)",
                "label=choice('a b','x=y,z')", "model.name='tiny model'").check()
    study = load(tmp_path)
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert results.best_trial == study.best_trial.number and results.best_value == study.best_value
    assert dict(results.best_params) == study.best_trial.params
    assert results.states == {"COMPLETE": 4}
    # The shell line splits back into the same override list, which composes the best trial's config.
    assert shlex.split(results.best_override_line) == list(results.best_overrides)
    # The launcher as the sweep ran (world size 1: a one-process torchrun), then the script and the best overrides
    # (C19; test_rerun_lines.py pastes such lines and checks the value).
    assert "--standalone --nproc_per_node 1 tests/apps/sweep_app.py " in results.rerun_command, results.rerun_command
    assert results.rerun_command.endswith(results.best_override_line), results.rerun_command
    with initialize_config_dir(config_dir=str(REPO / "tests/apps/conf"), version_base="1.3"):
        cfg = compose(config_name="app", overrides=list(results.best_overrides))
    recorded = records(tmp_path)[(study.best_trial.number, 0)]["config"]
    assert OmegaConf.to_container(cfg, resolve=True) == recorded
    # One progress line per trial on rank 0, and the table at the end.
    for t in study.trials:
        assert f"Trial {t.number} COMPLETE value" in res.output
    assert "trial  state     value" in res.output
    # (the plots: tests/test_settings_coverage.py::test_all_four_promised_plots_are_written_as_png_and_html)


def test_pareto_front_for_two_objectives(tmp_path):
    sweep(tmp_path, "hydra.sweeper.n_trials=6", "x=interval(-1,1)", "y=range(1,3)", "n_objectives=2",
          "hydra.sweeper.direction=[minimize,maximize]", "hydra/sweeper/sampler=nsgaii").check()
    study = load(tmp_path)
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    front = {e.number: e for e in results.pareto_front}
    assert set(front) == {t.number for t in study.best_trials}
    for t in study.best_trials:
        assert list(front[t.number]["values"]) == t.values
        assert dict(front[t.number].params) == t.params
        assert f"x={t.params['x']!r}" in front[t.number].override_line
    # (its plot: tests/test_settings_coverage.py::test_two_objectives_add_the_pareto_front_plot)


def test_too_few_trials_for_a_plot_never_fails_the_sweep(tmp_path):
    res = sweep(tmp_path, "hydra.sweeper.n_trials=1", "x=interval(-1,1)", plots_off=False).check()
    assert (tmp_path / "sweep" / "plots" / "optimization_history.png").exists()
    assert not (tmp_path / "sweep" / "plots" / "param_importances.png").exists()
    assert "Plots written" in res.output


def test_without_the_plots_extra_plots_are_skipped_with_a_log_line_and_the_sweep_finishes(tmp_path, monkeypatch):
    """README Install: ``[plots]`` brings matplotlib and plotly for "the PNG and HTML plots in
    ``<sweep dir>/plots/`` (skipped, with a log line, without them)". Both are hidden from the run through
    ``sys.modules`` (``None``: an import of them raises), as if not installed."""
    import sys

    for name in ("matplotlib", "plotly"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    res = sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", plots_off=False).check()
    assert load(tmp_path).best_trial is not None and len(load(tmp_path).trials) == 3
    assert (tmp_path / "sweep" / "optimization_results.yaml").exists()
    skipped = [line for line in res.output.splitlines() if "Plots skipped: " in line]
    assert len(skipped) == 1, res.output[-3000:]  # one line naming every skipped plot and why (issue 21)
    for name in ("optimization_history", "param_importances", "parallel_coordinate"):
        for kind in ("png", "html"):
            assert f"{name}.{kind}" in skipped[0], skipped[0]
    assert "pip install 'hydra-ds-optuna-sweeper[plots]'" in skipped[0]
    assert "import of matplotlib halted" in res.output and "import of plotly halted" in res.output
    assert "Plots written" not in res.output
    assert not [p for p in (tmp_path / "sweep" / "plots").glob("*") if p.suffix in (".png", ".html")]
