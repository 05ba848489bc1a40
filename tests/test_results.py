"""What a sweep leaves for people: optimization_results.yaml with a working rerun line, Pareto
front, plots, the per-trial log lines and the summary table.

In process at world size 1 (``tests/in_process.py``, issue 39 item 1): rank 0 alone writes all of it. The
rerun line of a 2-rank sweep (``--nproc_per_node 2``) is ``tests/test_command.py``'s and
``tests/multirank/test_refit.py::test_c19_c49_*``'s.

Tables for ``_study/_results.py`` (issue 39 item 4: rows that kill its mutants).

What rank 0 writes at the end, per the module's docstrings: ``optimization_results.yaml`` (counts per state with
INTERRUPTED apart from FAIL, the best trial for one objective, the Pareto front and ``solutions`` for several, as
the official hydra-optuna-sweeper writes them), ``trials.csv`` (the columns of Optuna's ``trials_dataframe``,
case C49), the trials table and the refit table (issue 38, C59). In-memory studies with fixed times.
"""

import shlex
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.torchrun_utils import REPO

from tests.in_process import sweep
from tests.multirank.sweep_helpers import load, records
import datetime as dt
import logging
from pathlib import Path
import optuna
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState
from hydra_plugins.ds_optuna_sweeper._study._command import RerunContext
from hydra_plugins.ds_optuna_sweeper._study._results import (
    RESULTS_FILE,
    TRIALS_CSV,
    finish_study,
    refit_table,
    summarize,
    summary_table,
    trials_in_study,
    trials_rows,
    write_results,
    write_trials_csv,
)


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
    """docs/getting-started.md: ``[plots]`` brings matplotlib and plotly for "the PNG and HTML plots in
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


T0 = dt.datetime(2026, 1, 2, 3, 4, 5)
RERUN = "torchrun --standalone --nproc_per_node 1 app.py"


@pytest.fixture(autouse=True)
def _launcher(monkeypatch):
    """This environment's bin dir on PATH and a known argv: rerun lines start with ``torchrun ... app.py``."""
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "DS_OPTUNA_LAUNCH_WORLD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.setattr(sys, "argv", ["app.py", "-m"])
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _add(study, state, values=None, params=None, attrs=None, seconds=1.5, start=True):
    params = params or {}
    dists = {k: FloatDistribution(0, 10) if isinstance(v, float) else CategoricalDistribution(["a", "b"])
             for k, v in params.items()}
    begin = T0 + dt.timedelta(minutes=len(study.trials)) if start else None
    end = begin + dt.timedelta(seconds=seconds) if begin is not None and seconds is not None else None
    study.add_trial(FrozenTrial(number=0, state=state, value=None, values=values, datetime_start=begin,
                                datetime_complete=end, params=params, distributions=dists, user_attrs=attrs or {},
                                system_attrs={}, intermediate_values={}, trial_id=0))


def _single():
    s = optuna.create_study(study_name="st")
    _add(s, TrialState.COMPLETE, [0.5], {"lr": 2.5, "opt": "a"}, {"gpu_peak_allocated_bytes": 3 * 2**20, "note": [1, 2],
                                                                   "ds_optuna:enqueued": True})
    _add(s, TrialState.COMPLETE, [0.25], {"lr": 1.0, "opt": "b"}, {"tag": "x"}, seconds=62.25)
    _add(s, TrialState.FAIL, None, {"lr": 3.0}, {"ds_optuna:interrupted": "SIGTERM"}, seconds=2.0)
    _add(s, TrialState.PRUNED, None, {"lr": 4.0}, {"ds_optuna:trial_group": 1, "d": {"k": 1}})
    _add(s, TrialState.FAIL, None, {"opt": "a"})
    return s


def _multi():
    s = optuna.create_study(study_name="mo", directions=["minimize", "maximize"])
    _add(s, TrialState.COMPLETE, [1.0, 2.0], {"lr": 1.0})
    _add(s, TrialState.COMPLETE, [2.0, 3.0], {"lr": 2.0})
    _add(s, TrialState.COMPLETE, [2.0, 1.0], {"lr": 3.0})   # dominated
    return s


def test_summarize_one_objective():
    assert summarize(_single(), RerunContext(None), ["minimize"], 10) == {
        "name": "ds_optuna", "study_name": "st", "directions": ["minimize"], "trials_in_study": 5,
        "n_trials_budget": 10, "states": {"COMPLETE": 2, "PRUNED": 1, "FAIL": 1, "INTERRUPTED": 1},
        "best_trial": 1, "best_value": 0.25, "best_params": {"lr": 1.0, "opt": "b"},
        "best_overrides": ["lr=1.0", "opt=b"], "best_override_line": "lr=1.0 opt=b",
        "rerun_command": f"{RERUN} lr=1.0 opt=b"}


def test_summarize_several_objectives_gives_the_pareto_front_and_solutions():
    entry = lambda n, values, lr: {"number": n, "values": values, "params": {"lr": lr}, "overrides": [f"lr={lr}"],  # noqa: E731
                                   "override_line": f"lr={lr}", "rerun_command": f"{RERUN} lr={lr}"}
    assert summarize(_multi(), RerunContext(None), ["minimize", "maximize"]) == {
        "name": "ds_optuna", "study_name": "mo", "directions": ["minimize", "maximize"], "trials_in_study": 3,
        "states": {"COMPLETE": 3},
        "pareto_front": [entry(0, [1.0, 2.0], 1.0), entry(1, [2.0, 3.0], 2.0)],
        "solutions": [{"params": {"lr": 1.0}, "values": [1.0, 2.0]}, {"params": {"lr": 2.0}, "values": [2.0, 3.0]}]}


@pytest.mark.parametrize("states, counts", [
    ([], {}),
    ([TrialState.FAIL, TrialState.PRUNED, TrialState.FAIL], {"FAIL": 2, "PRUNED": 1}),
])
def test_summarize_without_a_complete_trial_has_no_best_fields(states, counts):
    s = optuna.create_study(study_name="e")
    for state in states:
        _add(s, state)
    assert summarize(s, RerunContext(None), ["maximize"], 0) == {
        "name": "ds_optuna", "study_name": "e", "directions": ["maximize"], "trials_in_study": len(states),
        "n_trials_budget": 0, "states": counts}


@pytest.mark.parametrize("results, n", [
    ({"trials_in_study": 3, "n_trials": 5}, 3), ({"n_trials": "5"}, 5), ({}, None), ({"trials_in_study": None}, None),
])
def test_trials_in_study(results, n):
    assert trials_in_study(results) == n


def test_trials_rows_one_objective():
    """With an INTERRUPTED trial (a state Optuna does not name) the rows end in sweeper_state and continues."""
    start = lambda i: str(T0 + dt.timedelta(minutes=i))  # noqa: E731
    end = lambda i, s: str(T0 + dt.timedelta(minutes=i, seconds=s))  # noqa: E731
    assert trials_rows(_single()) == [
        {"number": 0, "value": 0.5, "datetime_start": start(0), "datetime_complete": end(0, 1.5), "duration_s": "1.500",
         "params_lr": 2.5, "params_opt": "a", "user_attrs_gpu_peak_allocated_bytes": 3 * 2**20,
         "user_attrs_note": "[1, 2]", "user_attrs_tag": "", "user_attrs_d": "", "state": "COMPLETE", "sweeper_state": "COMPLETE", "continues": ""},
        {"number": 1, "value": 0.25, "datetime_start": start(1), "datetime_complete": end(1, 62.25),
         "duration_s": "62.250", "params_lr": 1.0, "params_opt": "b", "user_attrs_gpu_peak_allocated_bytes": "",
         "user_attrs_note": "", "user_attrs_tag": "x", "user_attrs_d": "", "state": "COMPLETE", "sweeper_state": "COMPLETE", "continues": ""},
        {"number": 2, "value": "", "datetime_start": start(2), "datetime_complete": end(2, 2.0), "duration_s": "2.000",
         "params_lr": 3.0, "params_opt": "", "user_attrs_gpu_peak_allocated_bytes": "", "user_attrs_note": "",
         "user_attrs_tag": "", "user_attrs_d": "", "state": "FAIL", "sweeper_state": "INTERRUPTED", "continues": ""},
        {"number": 3, "value": "", "datetime_start": start(3), "datetime_complete": end(3, 1.5), "duration_s": "1.500",
         "params_lr": 4.0, "params_opt": "", "user_attrs_gpu_peak_allocated_bytes": "", "user_attrs_note": "",
         "user_attrs_tag": "", "user_attrs_d": '{"k": 1}', "state": "PRUNED", "sweeper_state": "PRUNED", "continues": ""},
        {"number": 4, "value": "", "datetime_start": start(4), "datetime_complete": end(4, 1.5), "duration_s": "1.500",
         "params_lr": "", "params_opt": "a", "user_attrs_gpu_peak_allocated_bytes": "", "user_attrs_note": "",
         "user_attrs_tag": "", "user_attrs_d": "", "state": "FAIL", "sweeper_state": "FAIL", "continues": ""},
    ]
    assert start(0) == "2026-01-02 03:04:05"  # isoformat with a space, as trials_dataframe shows it


def test_trials_rows_several_objectives_and_no_start():
    s = _multi()
    _add(s, TrialState.WAITING, None, {"lr": 5.0}, start=False)
    _add(s, TrialState.RUNNING, None, {"lr": 6.0}, seconds=None)  # started, not complete
    rows = trials_rows(s)
    assert (rows[4]["datetime_start"], rows[4]["datetime_complete"], rows[4]["duration_s"]) == (
        "2026-01-02 03:08:05", "", "")
    assert summary_table(s).splitlines()[-2:] == ["   3      WAITING   -      -        lr=5.0",
                                                  "   4      RUNNING   -      -        lr=6.0"]
    rows = rows[:4]
    assert [list(r) for r in rows[:1]] == [["number", "values_0", "values_1", "datetime_start", "datetime_complete",
                                           "duration_s", "params_lr", "state"]]
    assert [(r["values_0"], r["values_1"]) for r in rows] == [(1.0, 2.0), (2.0, 3.0), (2.0, 1.0), ("", "")]
    assert rows[3] == {"number": 3, "values_0": "", "values_1": "", "datetime_start": "", "datetime_complete": "",
                       "duration_s": "", "params_lr": 5.0, "state": "WAITING"}


@pytest.mark.parametrize("directions, header", [
    (["minimize"], "number,value,datetime_start,datetime_complete,duration_s,state\n"),
    (["minimize", "maximize"], "number,values_0,values_1,datetime_start,datetime_complete,duration_s,state\n"),
])
def test_trials_csv_of_a_study_without_trials_is_the_fixed_header(tmp_path, directions, header):
    path = write_trials_csv(optuna.create_study(directions=directions), str(tmp_path))
    assert path == tmp_path / TRIALS_CSV == tmp_path / "trials.csv"
    assert path.read_text() == header
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trials.csv"]  # no temporary file left


def test_trials_csv(tmp_path):
    write_trials_csv(_multi(), str(tmp_path))
    assert (tmp_path / "trials.csv").read_bytes().decode() == (  # lines end in \n, not the csv module's \r\n
        "number,values_0,values_1,datetime_start,datetime_complete,duration_s,params_lr,state\n"
        "0,1.0,2.0,2026-01-02 03:04:05,2026-01-02 03:04:06.500000,1.500,1.0,COMPLETE\n"
        "1,2.0,3.0,2026-01-02 03:05:05,2026-01-02 03:05:06.500000,1.500,2.0,COMPLETE\n"
        "2,2.0,1.0,2026-01-02 03:06:05,2026-01-02 03:06:06.500000,1.500,3.0,COMPLETE\n")


def test_write_results(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hydra_plugins.ds_optuna_sweeper._study._results")
    long = "torchrun --standalone " + "x=1 " * 40 + "end"
    refits = [{"trial": 1, "state": "COMPLETE", "metrics": {"acc": 0.9}, "rerun_command": long}]
    sw = tmp_path / "new" / "sw"  # made, parents included
    path = write_results(_single(), RerunContext(None), str(sw), ["minimize"], refits, budget=7,
                         stopped_by={"rule": "goal", "reason": "best 0.25 <= 0.3"})
    assert path == sw / RESULTS_FILE == sw / "optimization_results.yaml"
    tmp_path = sw.parent
    text = path.read_text()
    data = yaml.safe_load(text)
    assert list(data) == ["name", "study_name", "directions", "trials_in_study", "n_trials_budget", "states",
                          "best_trial", "best_value", "best_params", "best_overrides", "best_override_line",
                          "rerun_command", "stopped_by", "refit"]  # in this order, not sorted
    assert data["n_trials_budget"] == 7 and data["stopped_by"] == {"rule": "goal", "reason": "best 0.25 <= 0.3"}
    assert data["refit"] == refits
    assert f"rerun_command: {long}\n" in text  # one line, not folded at 80 columns (C19)
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == ["optimization_results.yaml", "trials.csv"]
    assert [r.getMessage() for r in caplog.records] == [
        f"Best trial 1: value 0.25, params {{'lr': 1.0, 'opt': 'b'}}\n  rerun: {RERUN} lr=1.0 opt=b",
        f"Trials by state: {{'COMPLETE': 2, 'PRUNED': 1, 'FAIL': 1, 'INTERRUPTED': 1}}; results in {path}"]


def test_write_results_without_a_best_trial_writes_no_best_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hydra_plugins.ds_optuna_sweeper._study._results")
    path = write_results(_multi(), RerunContext(None), str(tmp_path), ["minimize", "maximize"])
    data = yaml.safe_load(path.read_text())
    assert "stopped_by" not in data and "refit" not in data and "n_trials_budget" not in data
    assert [r.getMessage() for r in caplog.records] == [f"Trials by state: {{'COMPLETE': 3}}; results in {path}"]


def test_results_file_keeps_unicode(tmp_path):
    s = optuna.create_study(study_name="東京")
    _add(s, TrialState.COMPLETE, [1.0], {"lr": 1.0})
    assert "study_name: 東京\n" in write_results(s, RerunContext(None), str(tmp_path), ["minimize"]).read_text()


def test_summary_table():
    assert summary_table(_single()) == "\n".join([
        "   trial  state        value  seconds  group  GPU MiB  params",
        "   0      COMPLETE     0.5    1.5      -      3        lr=2.5 opt='a'",
        "*  1      COMPLETE     0.25   62.2     -      -        lr=1.0 opt='b'",
        "   2      INTERRUPTED  -      2.0      -      -        lr=3.0",
        "   3      PRUNED       -      1.5      1      -        lr=4.0",
        "   4      FAIL         -      1.5      -      -        opt='a'"])


def test_summary_table_shows_the_last_trials_and_only_the_columns_they_need():
    assert summary_table(_single(), limit=2) == "\n".join([
        "  trial  state   value  seconds  group  params",
        "  3      PRUNED  -      1.5      1      lr=4.0",
        "  4      FAIL    -      1.5      -      opt='a'"])
    assert summary_table(_multi()) == "\n".join([
        "   trial  state     value  seconds  params",
        "*  0      COMPLETE  1, 2   1.5      lr=1.0",
        "*  1      COMPLETE  2, 3   1.5      lr=2.0",
        "   2      COMPLETE  2, 1   1.5      lr=3.0"])
    assert summary_table(optuna.create_study()) == "  trial  state  value  seconds  params"


def test_summary_table_marks_one_best_trial_on_a_tie_the_one_the_results_name():
    """Two trials with the best value: the table marked both while the log line and ``optimization_results.yaml``
    name one (Optuna's ``best_trial``, the first), so the ``*`` goes to that one alone."""
    s = optuna.create_study()
    for value in (0.5, 0.25, 0.25):
        _add(s, TrialState.COMPLETE, [value], {"lr": value})
    marked = [line.split()[1] for line in summary_table(s).splitlines()[1:] if line.startswith("*")]
    assert marked == [str(s.best_trial.number)] == ["1"]


def test_summary_table_values_to_six_digits():
    s = optuna.create_study()
    _add(s, TrialState.COMPLETE, [0.123456789], {"lr": 1.0}, {"gpu_peak_allocated_bytes": 1536 * 2**20})
    assert summary_table(s).splitlines()[1] == "*  0      COMPLETE  0.123457  1.5      1536     lr=1.0"


def test_refit_table():
    assert refit_table([
        {"trial": 3, "state": "COMPLETE", "metrics": {"acc": 0.91234567, "loss": 1}},
        {"baseline": "base", "state": "FAIL", "metrics": {"acc": "n/a", "f1": 0.5}},
        {"trial": 5},
        {"baseline": "", "trial": 0, "state": "RUNNING", "metrics": None},
    ]) == "\n".join([
        "run            state     acc       loss  f1",
        "trial 3        COMPLETE  0.912346  1     -",
        "baseline base  FAIL      n/a       -     0.5",
        "trial 5        -         -         -     -",
        "trial 0        RUNNING   -         -     -"])
    assert refit_table([]) == "run  state"


def test_finish_study_logs_the_tables_and_writes_the_files(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hydra_plugins.ds_optuna_sweeper._study._results")
    refits = [{"trial": 1, "state": "COMPLETE", "metrics": {"acc": 0.5}}]
    finish_study(_multi(), RerunContext(None), str(tmp_path), ["minimize", "maximize"], refits, budget=3, plots=False,
                 stopped_by={"rule": "patience", "reason": "r"})
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == f"Trials of study 'mo':\n{summary_table(_multi())}"
    assert messages[1] == f"Refit runs of study 'mo':\n{refit_table(refits)}"
    data = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert (data["n_trials_budget"], data["stopped_by"], data["refit"]) == (3, {"rule": "patience", "reason": "r"},
                                                                          refits)
    assert not (tmp_path / "plots").exists()


def test_finish_study_never_raises(tmp_path, caplog):
    class Broken:
        study_name = "b"

        def get_trials(self, deepcopy=False):
            raise RuntimeError("storage gone")

    finish_study(Broken(), RerunContext(None), str(tmp_path), ["minimize"])
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR] == [
        ("ERROR", "Writing the results failed")]


def test_summary_table_of_a_study_without_a_complete_trial_marks_no_best():
    s = optuna.create_study()
    _add(s, TrialState.FAIL, None, {"lr": 1.0})
    assert summary_table(s) == "\n".join(["  trial  state  value  seconds  params", "  0      FAIL   -      1.5      lr=1.0"])


def test_summary_table_shows_the_last_50_trials_by_default():
    s = optuna.create_study()
    for i in range(51):
        _add(s, TrialState.COMPLETE, [float(i)], {"lr": 1.0})
    lines = summary_table(s).splitlines()
    assert len(lines) == 51 and lines[1].split()[0] == "1" and lines[-1].split()[0] == "50"


def test_finish_study_writes_the_plots_by_default(tmp_path, monkeypatch):
    from hydra_plugins.ds_optuna_sweeper._study import _plots

    calls = []
    monkeypatch.setattr(_plots, "write_plots", lambda study, sweep_dir: calls.append((study, sweep_dir)))
    study = _multi()
    finish_study(study, RerunContext(None), str(tmp_path), ["minimize", "maximize"])
    assert calls == [(study, str(tmp_path))]


def test_finish_study_after_a_storage_outage_gives_the_command_that_writes_the_results(tmp_path, monkeypatch, caplog):
    from hydra_plugins.ds_optuna_sweeper._study import _retry

    class Broken:
        study_name = "b"

        def get_trials(self, deepcopy=False):
            raise RuntimeError("storage gone")

    study = Broken()
    monkeypatch.setattr(_retry, "gave_up", lambda s: "the storage did not answer for 120 s" if s is study else None)
    finish_study(study, RerunContext(None), "/sw", ["minimize"])
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.ERROR] == [
        ("ERROR", "Writing the results failed: the storage did not answer for 120 s. Once the storage answers again, "
                  "the same command writes them (a study that holds n_trials runs no new trial):\n"
                  "python app.py -m hydra.sweep.dir=/sw")]


def test_trials_csv_is_utf8_whatever_the_locale(tmp_path):
    import locale

    s = optuna.create_study()
    _add(s, TrialState.COMPLETE, [1.0], {"city": "a"})
    saved = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale: open()'s default encoding would fail
        s.add_trial(optuna.trial.create_trial(value=2.0, params={"city": "b"},
                                              distributions={"city": CategoricalDistribution(["a", "b"])},
                                              user_attrs={"note": "東京"}))
        write_trials_csv(s, str(tmp_path))
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)
    assert "東京" in (tmp_path / "trials.csv").read_bytes().decode("utf-8")


def test_summary_table_when_the_best_trials_cannot_be_read():
    real = _multi()

    class Study:
        directions = real.directions

        def get_trials(self, deepcopy=False):
            return real.get_trials(deepcopy=deepcopy)

        @property
        def best_trials(self):
            raise ValueError("no best trials")

    assert summary_table(Study()) == "\n".join([  # no trial marked best, the mark column then empty
        "  trial  state     value  seconds  params",
        "  0      COMPLETE  1, 2   1.5      lr=1.0",
        "  1      COMPLETE  2, 3   1.5      lr=2.0",
        "  2      COMPLETE  2, 1   1.5      lr=3.0"])
