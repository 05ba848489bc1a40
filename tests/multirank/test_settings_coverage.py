"""Config-reference keys that had no test: each test reads back what was stored (study, storage
tables, files), not only an exit code.

``custom_search_space``, ``plot_every``, ``plots`` (all four promised plots, and the Pareto front),
``backend``, ``heartbeat_interval`` / ``grace_period``, ``max_failure_rate`` strictly between 0 and 1,
and resuming through ``storage`` + ``study_name`` from another sweep dir. The search space functions
live in ``tests/apps/search_space_fns.py``.
"""

import re
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from .sweep_helpers import LINGER, exit_lines, exit_statuses, load, records, run_sweep

pytestmark = [pytest.mark.torchrun]

C, F, R = TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING


def job_dirs(sweep: Path) -> list[str]:
    return sorted((p.name for p in sweep.iterdir() if p.is_dir() and p.name != "plots"), key=int)


# --- custom_search_space --------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_custom_search_space_param_is_stored_and_reaches_every_rank(tmp_path):
    """``custom_search_space`` at 2 ranks: the function runs on rank 0 once per trial, after ``x``
    was sampled, with the composed config; the ``lr`` it suggests is stored with its distribution and
    every rank's task gets exactly that ``lr`` (and the same trial params)."""
    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "label=from_cfg",
              "hydra.sweeper.custom_search_space=search_space_fns.suggest_lr", timeout_s=120).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C] * 3
    recs = records(tmp_path)
    assert sorted(recs) == [(n, r) for n in range(3) for r in range(2)]
    for t in study.trials:
        assert set(t.params) == {"x", "lr"}
        assert t.distributions["lr"] == FloatDistribution(1e-4, 1e-2, log=True)
        assert t.user_attrs["fn_saw_params"] == {"x": t.params["x"]}  # called after sampling
        assert t.user_attrs["fn_rank"] == "0"
        assert t.user_attrs["fn_cfg_label"] == "from_cfg"
        for r in range(2):
            assert recs[(t.number, r)]["config"]["lr"] == t.params["lr"]  # exact float64 on every rank
            assert recs[(t.number, r)]["trial_params"] == t.params
    assert len({t.params["lr"] for t in study.trials}) == 3  # sampled per trial, not a fixed value


@pytest.mark.timeout(120)
def test_custom_search_space_that_raises_fails_its_trial_and_stops(tmp_path):
    """A ``custom_search_space`` function that raises: its trial is told FAIL (not left RUNNING), the
    task never runs, and the sweep stops non-zero naming the function's error."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)",
                    "hydra.sweeper.custom_search_space=search_space_fns.fail", nproc=1, timeout_s=90)
    assert res.returncode != 0
    assert "custom_search_space failed for trial 0: search space function broke on purpose" in res.output
    assert [t.state for t in load(tmp_path).trials] == [F]
    assert records(tmp_path) == {}


# --- plots and plot_every -------------------------------------------------------------------------

TITLES = {
    "optimization_history": "Optimization History Plot",
    "param_importances": "Hyperparameter Importances",
    "parallel_coordinate": "Parallel Coordinate Plot",
    "intermediate_values": "Intermediate Values Plot",
    "pareto_front": "Pareto-front Plot",
}


def assert_plots(plots: Path, stems: set[str]) -> None:
    """Exactly ``stems`` as PNG and HTML, each a real image / a plotly page with that plot's title."""
    assert {p.name for p in plots.iterdir() if p.suffix in (".png", ".html")} == {
        f"{s}.{k}" for s in stems for k in ("png", "html")}
    for stem in stems:
        png = (plots / f"{stem}.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000, stem
        html = (plots / f"{stem}.html").read_text()
        assert f'"title":{{"text":"{TITLES[stem]}"' in html, stem
        assert 'src="plotly.min.js"' in html  # opens offline, with the script beside it
    assert (plots / "plotly.min.js").stat().st_size > 1_000_000


@pytest.mark.timeout(120)
def test_all_four_promised_plots_are_written_as_png_and_html(tmp_path):
    """``plots=true`` (default), one objective, reported steps: optimization history, parameter
    importances, parallel coordinates and intermediate values, each as PNG and HTML."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "y=range(1,3)", "steps=2", nproc=1,
                    timeout_s=90, plots_off=False).check()
    assert_plots(tmp_path / "sweep" / "plots", {"optimization_history", "param_importances", "parallel_coordinate",
                                                "intermediate_values"})
    assert res.output.count("Plots written to") == 1


@pytest.mark.timeout(120)
def test_two_objectives_add_the_pareto_front_plot(tmp_path):
    """Two objectives: the Pareto front joins the plots (history, importances and parallel
    coordinates of objective 0); no intermediate values (pruning is refused with several)."""
    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "y=range(1,3)", "n_objectives=2",
              "hydra.sweeper.direction=[minimize,minimize]", nproc=1, timeout_s=90, plots_off=False).check()
    assert_plots(tmp_path / "sweep" / "plots", {"pareto_front", "optimization_history", "param_importances",
                                                "parallel_coordinate"})


@pytest.mark.timeout(120)
def test_plot_every_refreshes_the_plots_during_the_sweep(tmp_path):
    """``plot_every=2`` with 4 trials: the plots exist after the 2nd finished trial (seen before
    trial 2 runs), are not rewritten after the 3rd, and are rewritten after the 4th and at the end.

    What the sweep dir held before each trial is stored by ``search_space_fns.record_plots``
    (a ``custom_search_space`` function, run on rank 0 just before the trial starts) as a user
    attribute: ``{png name: mtime in ns}``.
    """
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "hydra.sweeper.plot_every=2",
                    "hydra.sweeper.custom_search_space=search_space_fns.record_plots", nproc=1, timeout_s=90,
                    plots_off=False).check()
    seen = [t.user_attrs["plots_seen"] for t in load(tmp_path).trials]
    assert seen[0] == {} and seen[1] == {}
    assert set(seen[2]) == {"optimization_history.png", "param_importances.png", "parallel_coordinate.png"}
    assert seen[3] == seen[2]  # finished=3: no refresh
    final = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "sweep" / "plots").glob("*.png")}
    assert all(final[name] > mtime for name, mtime in seen[3].items())
    assert res.output.count("Plots written to") == 3  # after trials 2 and 4, and at the end


# --- backend --------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_backend_setting_builds_the_training_group(tmp_path):
    """``backend=cpu:gloo`` at 2 ranks: the default (training) group the sweeper creates has that
    backend on both ranks (the default on CPU is plain ``gloo``, so the log line can only come from
    the setting), and the task's all_reduce on it works in every trial."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "collectives=2",
                    "hydra.sweeper.backend=cpu:gloo", timeout_s=120).check()
    for r in range(2):
        assert f"rank {r}/2 (local rank {r}), training backend cpu:gloo, control plane gloo" in res.output
    assert [t.state for t in load(tmp_path).trials] == [C, C]
    assert sorted(records(tmp_path)) == [(n, r) for n in range(2) for r in range(2)]


@pytest.mark.timeout(150)
def test_bad_backend_stops_the_sweep_before_anything_runs(tmp_path):
    """An unknown ``backend`` stops the world before any study or trial exists, naming the value; every
    rank's own process exits 1 (``LINGER``: torchrun does not stop the second rank before it gets there)."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "hydra.sweeper.backend=nonsense",
                    timeout_s=120, env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    assert re.search(r"backend[^\n]*nonsense", res.output), res.output[-3000:]  # the bad value, as a backend
    assert not (tmp_path / "sweep" / "optuna.db").exists() and records(tmp_path) == {}
    assert "hydra.sweeper.backend='nonsense': unknown torch.distributed backend ['nonsense']; use one of" in res.output


# --- heartbeat_interval, grace_period -------------------------------------------------------------


def _heartbeats(db: Path) -> list[tuple[int, str, str]]:
    """``(trial number, state, heartbeat time)`` rows, read by this (second) process; [] while the
    schema does not exist yet or a writer holds the database."""
    if not db.exists():
        return []
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:  # waits out a writer
            return con.execute("SELECT t.number, t.state, h.heartbeat FROM trials t "
                               "JOIN trial_heartbeats h ON h.trial_id = t.trial_id").fetchall()
    except sqlite3.OperationalError:
        return []


@pytest.mark.timeout(150)
def test_heartbeat_interval_beats_into_the_storage_while_the_trial_runs(tmp_path):
    """``heartbeat_interval=1`` with a 12 s trial: another process reading the SQLite storage sees the
    running trial's heartbeat advance (Optuna's ``trial_heartbeats`` table), at least 3 distinct beats
    over 2 s or more, none more than 6 s apart (a reader may miss beats while the machine is loaded or a
    writer holds the database; the default interval, 60 s, would show one beat); with
    ``heartbeat_interval=null`` nothing is recorded. The second sweep (its own sweep dir, one short trial)
    runs beside the first one's long trial instead of after it."""
    db = tmp_path / "sweep" / "optuna.db"
    off = tmp_path / "off"
    beats: set[str] = set()
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(run_sweep, tmp_path, "hydra.sweeper.n_trials=1", "x=interval(-1,1)", "sleep_s=12",
                              "hydra.sweeper.heartbeat_interval=1", nproc=1, timeout_s=90)
        without = pool.submit(run_sweep, off, "hydra.sweeper.n_trials=1", "x=interval(-1,1)",
                              "hydra.sweeper.heartbeat_interval=null", nproc=1, timeout_s=90)
        while not running.done():
            beats |= {beat for number, state, beat in _heartbeats(db) if number == 0 and state == "RUNNING"}
            time.sleep(0.2)
        running.result().check()
        without.result().check()
    assert [t.state for t in load(tmp_path).trials] == [C]
    stamps = sorted(time.mktime(time.strptime(b[:19], "%Y-%m-%d %H:%M:%S")) for b in beats)
    assert len(stamps) >= 3 and stamps[-1] - stamps[0] >= 2, beats
    assert max(b - a for a, b in zip(stamps, stamps[1:])) <= 6, beats  # about every second (load aside), not every 60

    with closing(sqlite3.connect(off / "sweep" / "optuna.db")) as con:
        assert con.execute("SELECT count(*) FROM trial_heartbeats").fetchone() == (0,)


@pytest.mark.timeout(180)
def test_grace_period_decides_for_a_dead_workers_trial_without_owner_record(tmp_path):
    """A worker killed (``kill -9``, world size 1, so no torchrun group id) leaves trial 0 RUNNING
    with its heartbeat; its owner record is removed, as for a trial of an older sweeper or another tool
    (a trial with one is closed at once: ``test_a_killed_workers_trial_is_closed_at_once_whatever_the_grace``).
    The next worker with ``grace_period=60`` leaves it RUNNING although more than 2 x
    ``heartbeat_interval`` (Optuna's default grace) passed; the one after, with ``grace_period=2``,
    fails it before asking, and both run their own trials."""
    hb = ("hydra.sweeper.heartbeat_interval=1", "x=interval(-1,1)")
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=1", *hb, "fault.kind=kill9", "fault.rank=0", nproc=1,
                    timeout_s=90)
    assert res.returncode == -9
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [R]
    assert [n for n, _, _ in _heartbeats(tmp_path / "sweep" / "optuna.db")] == [0]
    with closing(sqlite3.connect(tmp_path / "sweep" / "optuna.db")) as con, con:
        assert con.execute("DELETE FROM trial_system_attributes WHERE key = 'ds_optuna:owner'").rowcount == 1
    time.sleep(2.5)  # > 2 x heartbeat_interval since that beat, before the next worker even starts

    run_sweep(tmp_path, "hydra.sweeper.n_trials=2", *hb, "hydra.sweeper.grace_period=60", nproc=1,
              timeout_s=90).check()
    assert [t.state for t in load(tmp_path).trials] == [R, C]

    run_sweep(tmp_path, "hydra.sweeper.n_trials=3", *hb, "hydra.sweeper.grace_period=2", nproc=1,
              timeout_s=90).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [F, C, C]
    assert set(study.trials[0].params) == {"x"}  # the failed trial keeps its params
    assert sorted((tmp_path / "records").glob("trial*_rank0.json")) == [
        tmp_path / "records" / f"trial{n}_rank0.json" for n in range(3)]


@pytest.mark.timeout(180)
def test_a_killed_workers_trial_is_closed_at_once_whatever_the_grace(tmp_path):
    """Case C54: the same ``kill -9``, trial 0 with its owner record (the dead launch's id). The next
    worker, with ``grace_period=60``, finds its owner lock free and closes it FAIL before asking, saying so."""
    hb = ("hydra.sweeper.heartbeat_interval=1", "x=interval(-1,1)")
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=1", *hb, "fault.kind=kill9", "fault.rank=0", nproc=1,
                    timeout_s=90)
    assert res.returncode == -9
    assert [t.state for t in load(tmp_path).trials] == [R]
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=2", *hb, "hydra.sweeper.grace_period=60", nproc=1,
                    timeout_s=90)
    res.check()
    assert [t.state for t in load(tmp_path).trials] == [F, C]
    assert re.search(r"trial 0 was RUNNING with no live owner \(launch \S+\): closed FAIL and not re-queued "
                     r"\(retry_failed_trials=0\)", res.output), res.output[-3000:]


# --- max_failure_rate strictly between 0 and 1 ----------------------------------------------------


@pytest.mark.timeout(120)
def test_failure_rate_at_the_limit_goes_on(tmp_path):
    """``max_failure_rate=0.5`` with trial 1 failing: the rate is 1/2 after it (not above 0.5), then
    1/3 and 1/4, so all 4 trials run and the sweep exits 0."""
    run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "hydra.sweeper.max_failure_rate=0.5", "x=interval(-1,1)",
              "fail_on_rank=0", "fail_on_trial=1", nproc=1, timeout_s=90).check()
    assert [t.state for t in load(tmp_path).trials] == [C, F, C, C]
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert dict(results.states) == {"COMPLETE": 3, "FAIL": 1}


@pytest.mark.timeout(120)
def test_failure_rate_above_the_limit_stops_with_the_rate(tmp_path):
    """``max_failure_rate=0.5`` with trials 1 and 2 failing: 1/2 goes on, 2/3 stops before trial 3
    is asked, with a non-zero exit and the rate in the message."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=5", "hydra.sweeper.max_failure_rate=0.5", "x=interval(-1,1)",
                    "fail_on_rank=0", "fail_on_trial=1", "fault.kind=raise", "fault.rank=0", "fault.trial=2",
                    nproc=1, timeout_s=90)
    assert res.returncode != 0
    assert "2 of 3 trials of this run failed (failure rate 0.67 > hydra.sweeper.max_failure_rate=0.5)" in res.output
    assert [t.state for t in load(tmp_path).trials] == [C, F, F]


# --- resume through storage + study_name ----------------------------------------------------------


@pytest.mark.timeout(180)
def test_resume_through_storage_and_study_name_from_another_sweep_dir(tmp_path):
    """A study in its own storage (not a sweep dir) resumes from a different sweep dir, at another
    world size: the 2nd run counts the 2 stored trials, runs trials 2-3 only (new numbers, new job
    dirs in its own sweep dir) and its results cover the whole study; a 3rd run with the budget
    spent runs nothing."""
    url = f"sqlite:///{tmp_path / 'store' / 'studies.db'}"
    (tmp_path / "store").mkdir()
    common = (f"hydra.sweeper.storage={url}", "hydra.sweeper.study_name=resumable", "x=interval(-1,1)")
    run_sweep(tmp_path / "a", "hydra.sweeper.n_trials=2", *common, nproc=1, timeout_s=90).check()
    res = run_sweep(tmp_path / "b", "hydra.sweeper.n_trials=4", *common, timeout_s=120).check()
    assert "Study 'resumable'" in res.output and "(2 already counted)" in res.output
    study = optuna.load_study(study_name="resumable", storage=url)
    assert [(t.number, t.state) for t in study.trials] == [(n, C) for n in range(4)]
    assert len({t.params["x"] for t in study.trials}) == 4
    assert job_dirs(tmp_path / "a" / "sweep") == ["0", "1"]
    assert job_dirs(tmp_path / "b" / "sweep") == ["2", "3"]
    assert sorted(records(tmp_path / "a")) == [(0, 0), (1, 0)]
    assert sorted(records(tmp_path / "b")) == [(n, r) for n in (2, 3) for r in range(2)]
    for sweep in ("a", "b"):
        assert not (tmp_path / sweep / "sweep" / "optuna.db").exists()  # the storage setting was used
    results = OmegaConf.load(tmp_path / "b" / "sweep" / "optimization_results.yaml")
    assert dict(results.states) == {"COMPLETE": 4} and results.best_trial == study.best_trial.number

    res = run_sweep(tmp_path / "c", "hydra.sweeper.n_trials=4", *common, nproc=1, timeout_s=90).check()
    assert "the study holds 4 trials (n_trials=4)" in res.output
    assert len(optuna.load_study(study_name="resumable", storage=url).trials) == 4
    assert records(tmp_path / "c") == {} and job_dirs(tmp_path / "c" / "sweep") == []


# --- params, plots=false --------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_params_node_is_searched_and_the_command_line_wins(tmp_path):
    """``hydra.sweeper.params`` is the search space, and a sweep of the same key on the command line
    replaces its expression: x from the node (interval), y from the command line (range(10,12),
    not the node's range(1,3))."""
    run_sweep(tmp_path, "hydra.sweeper.n_trials=4", "hydra.sweeper.params={x:'interval(-1,1)',y:'range(1,3)'}",
              "y=range(10,12)", "hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=0", nproc=1,
              timeout_s=90).check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C] * 4
    for t in study.trials:
        assert t.distributions["x"] == FloatDistribution(-1, 1)
        assert t.distributions["y"] == optuna.distributions.IntDistribution(10, 11)
        assert records(tmp_path)[(t.number, 0)]["config"]["y"] == t.params["y"]


@pytest.mark.timeout(120)
def test_plots_off_writes_no_plot_files(tmp_path):
    """``plots=false`` (even with ``plot_every=1``): no ``plots/`` dir and no "Plots written" line."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "steps=2", "hydra.sweeper.plots=false",
                    "hydra.sweeper.plot_every=1", nproc=1, timeout_s=90).check()
    assert [t.state for t in load(tmp_path).trials] == [C, C]
    assert not (tmp_path / "sweep" / "plots").exists()
    assert "Plots written" not in res.output
