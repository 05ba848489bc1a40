"""Config-reference keys that had no test: each test reads back what was stored (study, storage
tables, files), not only an exit code. In process at world size 1 (``tests/in_process.py``, issue 39 item 1):
each is rank 0's; the rank-1 side of a ``custom_search_space`` param and of ``backend`` is checked in
``tests/multirank/test_sweep.py::test_c01_one_study_one_sampler_same_config_on_every_rank``.

``custom_search_space``, ``plot_every``, ``plots`` (all four promised plots, and the Pareto front),
``backend``, ``heartbeat_interval`` / ``grace_period``, ``max_failure_rate`` strictly between 0 and 1,
and resuming through ``storage`` + ``study_name`` from another sweep dir. The search space functions
live in ``tests/apps/search_space_fns.py``.
"""

import re
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study._queue import counted_trials, lineage
from hydra_plugins.ds_optuna_sweeper._study._stored import NEVER_RAN_ATTR
from tests.in_process import sweep
from tests.multirank.sweep_helpers import load, records

C, F, R, W = TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING


def job_dirs(sweep_dir: Path) -> list[str]:
    return sorted((p.name for p in sweep_dir.iterdir() if p.is_dir() and p.name != "plots"), key=int)


# --- custom_search_space --------------------------------------------------------------------------


def test_custom_search_space_param_is_stored_and_reaches_the_task(tmp_path):
    """``custom_search_space``: the function runs on rank 0 once per trial, after ``x`` was sampled, with the
    composed config; the ``lr`` it suggests is stored with its distribution and the task gets exactly that
    ``lr`` (every rank's: ``test_c01_one_study_one_sampler_same_config_on_every_rank``)."""
    sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "label=from_cfg",
          "hydra.sweeper.custom_search_space=search_space_fns.suggest_lr").check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C] * 3
    recs = records(tmp_path)
    assert sorted(recs) == [(n, 0) for n in range(3)]
    for t in study.trials:
        assert set(t.params) == {"x", "lr"}
        assert t.distributions["lr"] == FloatDistribution(1e-4, 1e-2, log=True)
        assert t.user_attrs["fn_saw_params"] == {"x": t.params["x"]}  # called after sampling
        assert t.user_attrs["fn_rank"] == "0"
        assert t.user_attrs["fn_cfg_label"] == "from_cfg"
        assert recs[(t.number, 0)]["config"]["lr"] == t.params["lr"]  # exact float64
        assert recs[(t.number, 0)]["trial_params"] == t.params
    assert len({t.params["lr"] for t in study.trials}) == 3  # sampled per trial, not a fixed value


def test_custom_search_space_that_raises_fails_its_trial_and_stops(tmp_path):
    """A ``custom_search_space`` function that raises: its trial is told FAIL (not left RUNNING), the
    task never runs, and the sweep stops non-zero naming the function's error."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)",
                "hydra.sweeper.custom_search_space=search_space_fns.fail")
    assert res.returncode != 0
    assert "custom_search_space failed for trial 0: search space function broke on purpose" in res.output
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [F]
    assert records(tmp_path) == {}
    # it never ran: the budget does not count it (a fixed function and the same command run all 3)
    assert study.trials[0].user_attrs.get(NEVER_RAN_ATTR) is True
    assert counted_trials(study) == 0


@pytest.mark.parametrize("retry", [0, 1])
def test_sigterm_before_a_trial_leaves_rank_0_closes_it_uncounted_and_the_resume_runs_the_whole_budget(tmp_path, retry):
    """SIGTERM on rank 0 after Optuna's ask of trial 1 but before its payload left rank 0 (here, inside
    ``custom_search_space``): the trial is closed FAIL and marked never-ran, so ``n_trials`` does not count
    it; before, it counted, and the same command, resumed, ran one configuration short. With
    ``retry_failed_trials`` it is re-queued instead, unmarked: the retry (which would inherit a mark with the user
    attributes) replaces it in the budget."""
    args = ("hydra.sweeper.n_trials=3", "x=interval(-1,1)", f"hydra.sweeper.retry_failed_trials={retry}",
            "hydra.sweeper.custom_search_space=search_space_fns.sigterm_at_trial_1")
    res = sweep(tmp_path, *args)
    assert res.returncode == 143, res.output
    study = load(tmp_path)
    expected = [C, F, W] if retry else [C, F]
    assert [t.state for t in study.trials] == expected, [(t.number, t.state.name) for t in study.trials]
    assert study.trials[1].user_attrs.get(NEVER_RAN_ATTR) is (None if retry else True)
    assert counted_trials(study) == 1
    assert sorted(records(tmp_path)) == [(0, 0)]
    res = sweep(tmp_path, *args)  # the same command: trial 1's retry or a new trial 2, then one more
    res.check()
    assert "the study holds 4 trials, 3 of them counted (n_trials=3)" in res.output, res.output[-2000:]
    study = load(tmp_path)
    assert [t.state for t in study.trials].count(C) == 3, [(t.number, t.state.name) for t in study.trials]
    assert counted_trials(study) == 3
    assert not any(t.user_attrs.get(NEVER_RAN_ATTR) for t in study.trials if t.state == C)


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


def test_all_four_promised_plots_are_written_as_png_and_html(tmp_path):
    """``plots=true`` (default), one objective, reported steps: optimization history, parameter
    importances, parallel coordinates and intermediate values, each as PNG and HTML."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "y=range(1,3)", "steps=2",
                plots_off=False).check()
    assert_plots(tmp_path / "sweep" / "plots", {"optimization_history", "param_importances", "parallel_coordinate",
                                                "intermediate_values"})
    assert res.output.count("Plots written to") == 1


def test_two_objectives_add_the_pareto_front_plot(tmp_path):
    """Two objectives: the Pareto front joins the plots (history, importances and parallel
    coordinates of objective 0); no intermediate values (pruning is refused with several)."""
    sweep(tmp_path, "hydra.sweeper.n_trials=3", "x=interval(-1,1)", "y=range(1,3)", "n_objectives=2",
          "hydra.sweeper.direction=[minimize,minimize]", plots_off=False).check()
    assert_plots(tmp_path / "sweep" / "plots", {"pareto_front", "optimization_history", "param_importances",
                                                "parallel_coordinate"})


def test_plot_every_refreshes_the_plots_during_the_sweep(tmp_path):
    """``plot_every=2`` with 4 trials: the plots exist after the 2nd finished trial (seen before
    trial 2 runs), are not rewritten after the 3rd, and are rewritten after the 4th and at the end.

    What the sweep dir held before each trial is stored by ``search_space_fns.record_plots``
    (a ``custom_search_space`` function, run on rank 0 just before the trial starts) as a user
    attribute: ``{png name: mtime in ns}``.
    """
    res = sweep(tmp_path, "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "hydra.sweeper.plot_every=2",
                "hydra.sweeper.custom_search_space=search_space_fns.record_plots", plots_off=False).check()
    seen = [t.user_attrs["plots_seen"] for t in load(tmp_path).trials]
    assert seen[0] == {} and seen[1] == {}
    assert set(seen[2]) == {"optimization_history.png", "param_importances.png", "parallel_coordinate.png"}
    assert seen[3] == seen[2]  # finished=3: no refresh
    final = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "sweep" / "plots").glob("*.png")}
    assert all(final[name] > mtime for name, mtime in seen[3].items())
    assert res.output.count("Plots written to") == 3  # after trials 2 and 4, and at the end


# --- backend --------------------------------------------------------------------------------------


def test_bad_backend_stops_the_sweep_before_anything_runs(tmp_path):
    """An unknown ``backend`` stops the sweep before any study or trial exists, naming the value (the
    setting taking effect on every rank is ``test_c01_one_study_one_sampler_same_config_on_every_rank``;
    a refusal ending every rank alike is ``tests/multirank/test_setup_refusal.py``'s)."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "hydra.sweeper.backend=nonsense")
    assert res.returncode == 1
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


def test_heartbeat_interval_beats_into_the_storage_while_the_trial_runs(tmp_path):
    """``heartbeat_interval=1`` with a 4 s trial: a thread reading the SQLite storage on its own connection
    sees the running trial's heartbeat advance (Optuna's ``trial_heartbeats`` table), at least 3 distinct beats
    over 2 s or more, none more than 3 s apart (the default interval, 60 s, would show one beat); with
    ``heartbeat_interval=null`` nothing is recorded."""
    db = tmp_path / "sweep" / "optuna.db"
    beats: set[str] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            beats.update(beat for number, state, beat in _heartbeats(db) if number == 0 and state == "RUNNING")
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        sweep(tmp_path, "hydra.sweeper.n_trials=1", "x=interval(-1,1)", "sleep_s=4",
              "hydra.sweeper.heartbeat_interval=1").check()
    finally:
        done.set()
        watcher.join(timeout=10)
    assert [t.state for t in load(tmp_path).trials] == [C]
    stamps = sorted(time.mktime(time.strptime(b[:19], "%Y-%m-%d %H:%M:%S")) for b in beats)
    assert len(stamps) >= 3 and stamps[-1] - stamps[0] >= 2, beats
    assert max(b - a for a, b in zip(stamps, stamps[1:])) <= 3, beats  # about every second, not every 60

    off = tmp_path / "off"
    sweep(off, "hydra.sweeper.n_trials=1", "x=interval(-1,1)", "hydra.sweeper.heartbeat_interval=null").check()
    with closing(sqlite3.connect(off / "sweep" / "optuna.db")) as con:
        assert con.execute("SELECT count(*) FROM trial_heartbeats").fetchone() == (0,)


def _dead_workers_trial(tmp_path: Path) -> None:
    """What a worker killed mid-trial with ``heartbeat_interval=1`` leaves and a trial of an older sweeper or
    another tool has: trial 0 RUNNING with its ``x`` and a heartbeat, and no owner record (the killed launch
    itself: ``tests/faults/test_killed_launch.py``)."""
    (tmp_path / "sweep").mkdir(parents=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}", heartbeat_interval=1)
    study = optuna.create_study(study_name="sweep_app", storage=storage)
    trial = study.ask()
    trial.suggest_float("x", -1, 1)
    storage.record_heartbeat(trial._trial_id)
    assert [n for n, _, _ in _heartbeats(tmp_path / "sweep" / "optuna.db")] == [0]


def test_grace_period_decides_for_a_dead_workers_trial_without_owner_record(tmp_path):
    """Trial 0 RUNNING with a heartbeat and no owner record (a trial with one is closed at once:
    ``test_a_killed_workers_trial_is_closed_at_once_whatever_the_grace``). The next worker with
    ``grace_period=60`` leaves it RUNNING although more than 2 x ``heartbeat_interval`` (Optuna's default
    grace) passed; the one after, with ``grace_period=2``, fails it before asking, and both run their own
    trials."""
    hb = ("hydra.sweeper.heartbeat_interval=1", "x=interval(-1,1)")
    _dead_workers_trial(tmp_path)
    time.sleep(2.5)  # > 2 x heartbeat_interval since that beat, before the next worker even starts

    sweep(tmp_path, "hydra.sweeper.n_trials=2", *hb, "hydra.sweeper.grace_period=60").check()
    assert [t.state for t in load(tmp_path).trials] == [R, C]

    sweep(tmp_path, "hydra.sweeper.n_trials=3", *hb, "hydra.sweeper.grace_period=2").check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [F, C, C]
    assert set(study.trials[0].params) == {"x"}  # the failed trial keeps its params
    assert sorted((tmp_path / "records").glob("trial*_rank0.json")) == [
        tmp_path / "records" / f"trial{n}_rank0.json" for n in (1, 2)]


def test_a_killed_workers_trial_is_closed_at_once_whatever_the_grace(tmp_path):
    """Case C54: trial 0 RUNNING with the owner record of a process that held the study's owner lock and was
    killed (``kill -9``; ``tests/test_owners.py``'s owner). The next worker, with ``grace_period=60``, finds the
    owner lock free and closes it FAIL before asking, saying so."""
    from tests.test_owners import _kill9, _start_owner

    (tmp_path / "sweep").mkdir()
    proc, _ = _start_owner(f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}", "sweep_app")
    _kill9(proc)
    assert [t.state for t in load(tmp_path).trials] == [R]
    res = sweep(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.heartbeat_interval=1", "x=interval(-1,1)",
                "hydra.sweeper.grace_period=60").check()
    assert [t.state for t in load(tmp_path).trials] == [F, C]
    assert re.search(r"trial 0 was RUNNING with no live owner \(launch \S+\): closed FAIL and not re-queued "
                     r"\(retry_failed_trials=0\)", res.output), res.output[-3000:]


# --- max_failure_rate strictly between 0 and 1 ----------------------------------------------------


def test_failure_rate_at_the_limit_goes_on(tmp_path):
    """``max_failure_rate=0.5`` with trial 1 failing: the rate is 1/2 after it (not above 0.5), then
    1/3 and 1/4, so all 4 trials run and the sweep exits 0."""
    sweep(tmp_path, "hydra.sweeper.n_trials=4", "hydra.sweeper.max_failure_rate=0.5", "x=interval(-1,1)",
          "fail_on_rank=0", "fail_on_trial=1").check()
    assert [t.state for t in load(tmp_path).trials] == [C, F, C, C]
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert dict(results.states) == {"COMPLETE": 3, "FAIL": 1}


def test_failure_rate_above_the_limit_stops_with_the_rate(tmp_path):
    """``max_failure_rate=0.5`` with trials 1 and 2 failing: 1/2 goes on, 2/3 stops before trial 3
    is asked, with a non-zero exit and the rate in the message."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=5", "hydra.sweeper.max_failure_rate=0.5", "x=interval(-1,1)",
                "fail_on_rank=0", "fail_on_trial=1", "fault.kind=raise", "fault.rank=0", "fault.trial=2")
    assert res.returncode != 0
    assert "2 of 3 trials of this run failed (failure rate 0.67 > hydra.sweeper.max_failure_rate=0.5)" in res.output
    assert [t.state for t in load(tmp_path).trials] == [C, F, F]


# --- resume through storage + study_name ----------------------------------------------------------


def test_resume_through_storage_and_study_name_from_another_sweep_dir(tmp_path):
    """A study in its own storage (not a sweep dir) resumes from a different sweep dir: the 2nd run counts
    the 2 stored trials, runs trials 2-3 only (new numbers, new job dirs in its own sweep dir) and its
    results cover the whole study; a 3rd run with the budget spent runs nothing. (Rank 0 alone opens the
    storage: the world size of the resuming run changes nothing here.)"""
    url = f"sqlite:///{tmp_path / 'store' / 'studies.db'}"
    (tmp_path / "store").mkdir()
    common = (f"hydra.sweeper.storage={url}", "hydra.sweeper.study_name=resumable", "x=interval(-1,1)")
    sweep(tmp_path / "a", "hydra.sweeper.n_trials=2", *common).check()
    res = sweep(tmp_path / "b", "hydra.sweeper.n_trials=4", *common).check()
    assert "Study 'resumable'" in res.output and "(2 already counted)" in res.output
    study = optuna.load_study(study_name="resumable", storage=url)
    assert [(t.number, t.state) for t in study.trials] == [(n, C) for n in range(4)]
    assert len({t.params["x"] for t in study.trials}) == 4
    assert job_dirs(tmp_path / "a" / "sweep") == ["0", "1"]
    assert job_dirs(tmp_path / "b" / "sweep") == ["2", "3"]
    assert sorted(records(tmp_path / "a")) == [(0, 0), (1, 0)]
    assert sorted(records(tmp_path / "b")) == [(2, 0), (3, 0)]
    for sweep_ in ("a", "b"):
        assert not (tmp_path / sweep_ / "sweep" / "optuna.db").exists()  # the storage setting was used
    results = OmegaConf.load(tmp_path / "b" / "sweep" / "optimization_results.yaml")
    assert dict(results.states) == {"COMPLETE": 4} and results.best_trial == study.best_trial.number

    res = sweep(tmp_path / "c", "hydra.sweeper.n_trials=4", *common).check()
    assert "the study holds 4 trials (n_trials=4)" in res.output
    assert len(optuna.load_study(study_name="resumable", storage=url).trials) == 4
    assert records(tmp_path / "c") == {} and job_dirs(tmp_path / "c" / "sweep") == []


# --- params, plots=false --------------------------------------------------------------------------


def test_params_node_is_searched_and_the_command_line_wins(tmp_path):
    """``hydra.sweeper.params`` is the search space, and a sweep of the same key on the command line
    replaces its expression: x from the node (interval), y from the command line (range(10,12),
    not the node's range(1,3))."""
    sweep(tmp_path, "hydra.sweeper.n_trials=4", "hydra.sweeper.params={x:'interval(-1,1)',y:'range(1,3)'}",
          "y=range(10,12)", "hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=0").check()
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C] * 4
    for t in study.trials:
        assert t.distributions["x"] == FloatDistribution(-1, 1)
        assert t.distributions["y"] == optuna.distributions.IntDistribution(10, 11)
        assert records(tmp_path)[(t.number, 0)]["config"]["y"] == t.params["y"]


def test_plots_off_writes_no_plot_files(tmp_path):
    """``plots=false`` (even with ``plot_every=1``): no ``plots/`` dir and no "Plots written" line."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)", "steps=2", "hydra.sweeper.plots=false",
                "hydra.sweeper.plot_every=1").check()
    assert [t.state for t in load(tmp_path).trials] == [C, C]
    assert not (tmp_path / "sweep" / "plots").exists()
    assert "Plots written" not in res.output


def test_the_retry_of_an_interrupted_trial_is_not_interrupted_itself_when_it_fails(tmp_path):
    """A trial stopped on ``should_preempt()`` is stored FAIL with ``ds_optuna:interrupted`` and re-queued; Optuna's
    retry copies the user attributes, so the retry carried the mark: a newcomer saw it on a COMPLETE retry, and a
    retry that then failed for real was shown INTERRUPTED (and passed over by ASHA's continuation rule). The ask
    clears the copied value."""
    preempt = ("x=interval(-1,1)", "hydra.sweeper.n_trials=3", "fault.kind=preempt", "fault.rank=all",
               "fault.trial=1", "fault.phase=before")
    res = sweep(tmp_path, *preempt)
    assert res.returncode == 143, res.output
    study = load(tmp_path)
    assert [t.state for t in study.trials] == [C, F, W], [(t.number, t.state.name) for t in study.trials]
    assert study.trials[1].user_attrs.get(NEVER_RAN_ATTR) is None
    assert "preempted" in study.trials[1].user_attrs["ds_optuna:interrupted"]
    # the same command, the retry (trial 2) raising this time
    res = sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.n_trials=3", "fault.kind=raise", "fault.rank=all",
                "fault.trial=2", "fault.phase=before")
    assert res.returncode == 1, res.output
    retry = load(tmp_path).trials[2]
    assert retry.state == F and retry.user_attrs.get("ds_optuna:continues") == 1
    assert not retry.user_attrs.get("ds_optuna:interrupted")
    assert "Trial 2 FAIL" in res.output or "2      FAIL" in res.output, res.output[-3000:]
    assert "2      INTERRUPTED" not in res.output


@pytest.mark.parametrize("retry", [0, 1])
@pytest.mark.parametrize("queued", ["retry of a preempted trial", "warm start"])
def test_a_queued_trial_that_no_rank_ran_goes_back_to_the_queue(tmp_path, queued, retry):
    """SIGTERM on rank 0 while it prepares a trial the ask took from the queue (after the ask, before the payload
    leaves): the trial is closed never-ran and its work put back in the queue, so the same command runs it. Before,
    a preempted trial's retry closed this way left the preempted configuration owed to nobody, and a warm start
    came back only as "failed before; queued again" (the kind of fault of the ASHA promotion in test_asha). With
    ``retry_failed_trials`` the same: it goes back as it was, without spending a retry."""
    space = ("x=interval(-1,1)", "hydra.sweeper.n_trials=3", f"hydra.sweeper.retry_failed_trials={retry}")
    if queued == "warm start":
        space += ("hydra.sweeper.enqueue_trials=[{x:0.25}]",)
    else:
        sweep(tmp_path, *space, "fault.kind=preempt", "fault.rank=all", "fault.trial=1", "fault.phase=before").check(143)
    res = sweep(tmp_path, *space,
                "hydra.sweeper.custom_search_space=search_space_fns.sigterm_at_the_first_queued_trial").check(143)
    trials = load(tmp_path).trials
    closed, again = [t for t in trials if t.user_attrs.get(NEVER_RAN_ATTR)], trials[-1]
    assert len(closed) == 1 and closed[0].state == F, trials
    closed = closed[0]
    assert (f"Trial(s) [{closed.number}] marked FAIL (SIGTERM); [{closed.number}] never ran (not counted in "
            f"n_trials), queued again as trial(s) [{again.number}]\n") in res.output, res.output[-3000:]
    assert re.search(rf"\n +{closed.number} +NEVER_RAN +- ", res.output), res.output[-3000:]  # the trials table
    assert again.state == W and again.number == closed.number + 1, trials
    assert lineage(again)[:-1] == lineage(closed)[:-1]  # the copy continues what the closed trial was to continue
    assert again.system_attrs.get("fixed_params") == closed.system_attrs.get("fixed_params")
    assert NEVER_RAN_ATTR not in again.user_attrs
    res = sweep(tmp_path, *space)
    res.check()
    study = load(tmp_path)
    assert [t.state for t in study.trials].count(C) == counted_trials(study) == 3, study.trials
    assert study.trials[again.number].state == C and study.trials[again.number].params == closed.params
    assert "queued again" not in res.output  # the warm start was still queued: not enqueued twice


def test_a_custom_search_space_path_that_imports_nothing_is_refused_before_the_study_exists(tmp_path):
    """A mistyped ``custom_search_space`` path is refused at set-up naming the key, and leaves no study (a newcomer's
    ``space.spac`` left an empty ``optuna.db``: the function was imported after the study was opened)."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)",
                "hydra.sweeper.custom_search_space=search_space_fns.suggest_lrr")
    assert res.returncode == 1, res.output
    assert "hydra.sweeper.custom_search_space='search_space_fns.suggest_lrr' cannot be imported" in res.output
    assert not (tmp_path / "sweep" / "optuna.db").exists()
    assert records(tmp_path) == {}
