"""Refit (issue 13): after the search, every rank runs the chosen trials' configs once more with the
refit overrides, in ``<sweep dir>/refit/<trial>``; rank 0 records metrics and the rerun line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import LINGER, exit_env, exit_lines, exit_statuses, paste_rerun_line
from tests.torchrun_utils import run_python, run_torchrun

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(240)]

APP = "tests/apps/rerun_app.py"
REFIT = ["hydra.sweeper.refit.enabled=true", "hydra.sweeper.refit.overrides=['stage=final']"]


def _run(tmp_path: Path, *args: str, nproc: int = 1, env: dict | None = None):
    """The app in a sweep; each rank's observed exit status goes to ``tmp_path/exits`` (:func:`exit_statuses`)."""
    argv = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *args]
    env = {"DSO_RECORD_DIR": str(tmp_path / "rec"), **exit_env(tmp_path), **(env or {})}
    if nproc > 1:
        return run_torchrun(APP, argv, nproc=nproc, cwd=tmp_path, extra_env=env)
    return run_python(APP, argv, cwd=tmp_path, extra_env=env)


def _results(tmp_path: Path) -> dict:
    return yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="rerun_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")


def test_refit_of_the_best_and_the_enqueued_trial_at_world_size_1(tmp_path):
    res = _run(tmp_path, "x=interval(0,1)", "hydra.sweeper.enqueue_trials=[{x:0.9}]", *REFIT,
               "hydra.sweeper.refit.trials=[best,enqueued]").check()
    assert re.search(r"\[1/3\] Trial 0 COMPLETE value [\d.]+ in [\d.]+ s, params \{'x': 0.9\}; best [\d.]+ \(trial 0\); ETA \d+ s",
                     res.output), res.output[-3000:]  # k/n, best so far and ETA on each trial's line
    results = _results(tmp_path)
    best = results["best_trial"]
    refits = {r["trial"]: r for r in results["refit"]}
    assert set(refits) == {best, 0}  # trial 0 is the enqueued warm start
    for number, entry in refits.items():
        searched = _study(tmp_path).trials[number].value
        assert entry["state"] == "COMPLETE"
        assert entry["metrics"] == {"test_value": searched + 10.0, "units": 0.0}
        assert entry["overrides"][-1] == "stage=final"
        assert "stage=final" in entry["rerun_command"] and "\n" not in entry["rerun_command"]
        overrides = yaml.safe_load((tmp_path / "sweep" / "refit" / str(number) / ".hydra" / "overrides.yaml").read_text())
        assert "stage=final" in overrides
    assert len(_study(tmp_path).trials) == 3  # the refit adds no trial


def test_refit_at_two_ranks_replays_task_suggested_params(tmp_path):
    # 'enqueued' names no trial here (no warm start): said in the log, and the best trial is refit alone.
    res = _run(tmp_path, "x=interval(0,1)", "layers=2", *REFIT, "hydra.sweeper.refit.trials=[best,enqueued]",
               nproc=2).check()
    assert "refit.trials names 'enqueued', but the study has no COMPLETE trial from" in res.output
    results = _results(tmp_path)
    (entry,) = results["refit"]
    assert entry["trial"] == results["best_trial"]
    assert entry["metrics"]["test_value"] == results["best_value"] + 10.0  # same units, same world size
    best_units = sorted(v for k, v in results["best_params"].items() if k.startswith("n_units_l"))
    assert entry["metrics"]["units"] == float(sum(best_units))
    assert entry["rerun_command"].startswith("DS_OPTUNA_TRIAL=")


def test_a_failing_refit_exits_non_zero_on_every_rank_and_keeps_the_search(tmp_path):
    res = _run(tmp_path, "x=interval(0,1)", *REFIT, "fail_final=true", "hydra.sweeper.plots=false", nproc=2,
               env=LINGER)
    assert res.returncode != 0
    assert exit_statuses(tmp_path) == {0: 1, 1: 1}, exit_lines(tmp_path)
    # said by rank 0, and in torchrun's report of it; not once per rank under a traceback (issue 38, C59)
    assert res.output.count("ds_optuna stopped the sweep: TrialFailedError: refit failed (trial") == 2, res.output[-4000:]
    assert "RuntimeError: injected refit failure" in res.output
    results = _results(tmp_path)
    assert results["refit"][0]["state"] == "FAIL" and "injected refit failure" in results["refit"][0]["error"]
    assert [t.state for t in _study(tmp_path).trials] == [TrialState.COMPLETE] * 3


def test_refit_on_an_existing_study_without_new_trials(tmp_path):
    _run(tmp_path, "x=interval(0,1)").check()
    before = [(t.number, t.value) for t in _study(tmp_path).trials]
    res = _run(tmp_path, "x=interval(0,1)", *REFIT, "hydra.sweeper.refit.trials=[1]").check()
    assert "the study holds 3 trials" in res.output
    assert [(t.number, t.value) for t in _study(tmp_path).trials] == before
    (entry,) = _results(tmp_path)["refit"]
    assert entry["trial"] == 1 and entry["metrics"]["test_value"] == before[1][1] + 10.0
    value = json.loads((tmp_path / "rec" / "value_sweep_final_1.json").read_text())["value"]
    assert value == before[1][1] + 10.0


def test_refit_best_with_several_objectives_is_refused_before_anything_runs(tmp_path):
    res = _run(tmp_path, "x=interval(0,1)", "n_objectives=2", "hydra.sweeper.direction=[minimize,minimize]", *REFIT)
    assert res.returncode != 0
    assert "no single best trial: name the trials to refit by number" in res.output
    assert not (tmp_path / "rec").exists()


def test_a_refit_task_returning_a_number_records_it_as_value(tmp_path):
    """README Refit: "The task may return a number or a dict of metrics"; a number is written as
    ``metrics: {value: x}`` (the dict form is the other tests')."""
    res = _run(tmp_path, "x=interval(0,1)", *REFIT, "+final_returns_number=true").check()
    results = _results(tmp_path)
    (entry,) = results["refit"]
    assert entry["trial"] == results["best_trial"] and entry["state"] == "COMPLETE"
    assert entry["metrics"] == {"value": results["best_value"] + 10.0}, entry
    assert f"Refit of trial {entry['trial']} COMPLETE: metrics {{'value': " in res.output
    recorded = json.loads((tmp_path / "rec" / f"value_sweep_final_{entry['trial']}.json").read_text())["value"]
    assert entry["metrics"]["value"] == recorded


def test_refit_baselines_run_next_to_the_best_trial_on_every_rank(tmp_path):
    """README Refit, ``refit.baselines``: named configs that are no trial (a hand-picked default, a library's
    defaults) are trained once more with the refit overrides, after the chosen trials, at world size 2; each
    gets its own dir, results entry (``baseline: <name>``, ``trial: null``), rerun line and job log line, and
    the study gets no trial."""
    res = _run(tmp_path, "x=interval(0,1)", *REFIT, "hydra.sweeper.refit.trials=[best]",
               "hydra.sweeper.refit.baselines={at_zero:{x:0.0},as_composed:{}}", nproc=2).check()
    results = _results(tmp_path)
    assert [r["trial"] for r in results["refit"]] == [results["best_trial"], None, None]
    best, at_zero, as_composed = results["refit"]
    assert "baseline" not in best and at_zero["baseline"] == "at_zero" and as_composed["baseline"] == "as_composed"
    # value = (x - 0.3)^2 + opt.scale + 0.01 * world size; the refit stage adds 10 (tests/apps/rerun_app.py)
    scale = yaml.safe_load((Path(__file__).parents[1] / "apps" / "conf_rerun" / "opt" / "sgd.yaml").read_text())["scale"]
    assert at_zero["metrics"]["test_value"] == pytest.approx(0.09 + scale + 0.02 + 10.0)
    assert as_composed["metrics"]["test_value"] == pytest.approx(0.04 + scale + 0.02 + 10.0)  # x: 0.5 in rerun.yaml
    assert best["metrics"]["test_value"] == pytest.approx(results["best_value"] + 10.0)
    for entry in (at_zero, as_composed):
        assert entry["state"] == "COMPLETE" and entry["overrides"][-1] == "stage=final"
        assert entry["job_dir"] == str(tmp_path / "sweep" / "refit" / entry["baseline"])
        assert f"rerun/refit-{entry['baseline']}" in entry["rerun_command"]
        assert f"Refit of baseline {entry['baseline']} COMPLETE" in res.output
    assert "x=0.0" in at_zero["overrides"] and not any(o.startswith("x=") for o in as_composed["overrides"])
    overrides = yaml.safe_load((tmp_path / "sweep" / "refit" / "at_zero" / ".hydra" / "overrides.yaml").read_text())
    assert "x=0.0" in overrides and "stage=final" in overrides
    logs = sorted((tmp_path / "sweep" / "refit" / "at_zero").glob("*.log"))
    assert len(logs) == 2 and all("refit of baseline at_zero COMPLETE" in p.read_text() for p in logs), logs
    assert len(_study(tmp_path).trials) == 3  # baselines are no trials


def test_a_baseline_answers_the_tasks_own_suggest_calls_with_its_plus_keys(tmp_path):
    """README Refit: a task that suggests a param itself gets, in a baseline, the value of the baseline's
    ``+<name>`` key; a baseline without it fails with a message that says how to give one (a new user got
    "DS_OPTUNA_TRIAL replays trial -1 ... the task's suggest_* calls changed since the sweep", and the
    README's advice could not be followed). The baseline's rerun line reproduces its value."""
    res = _run(tmp_path, "x=interval(0,1)", "layers=1", *REFIT, "hydra.sweeper.n_trials=2",
               "hydra.sweeper.refit.baselines={wide:{+n_units_l0:100},bare:{}}")
    assert res.returncode != 0
    wide, bare = _results(tmp_path)["refit"][1:]
    scale = yaml.safe_load((Path(__file__).parents[1] / "apps" / "conf_rerun" / "opt" / "sgd.yaml").read_text())["scale"]
    assert wide["state"] == "COMPLETE" and wide["metrics"]["units"] == 100.0
    assert wide["metrics"]["test_value"] == pytest.approx(0.04 + scale + 0.01 + 0.1 + 10.0)
    assert bare["state"] == "FAIL", bare
    assert ("baseline bare answers suggest_* only with its own values [], but the task asked for 'n_units_l0': "
            "give it a value in the baseline, e.g. hydra.sweeper.refit.baselines.bare={+n_units_l0:<value>}"
            in bare["error"]), bare["error"]
    assert "changed since the sweep" not in res.output
    assert paste_rerun_line(tmp_path, wide["rerun_command"], stage="final") == wide["metrics"]["test_value"]


@pytest.mark.parametrize("value, message", [
    ("{7:{x:0.1}}", "hydra.sweeper.refit.baselines.7"),  # a trial's refit dir is refit/<number>
    ("{a:0.1}", "hydra.sweeper.refit.baselines.a must be a mapping of config keys to values"),
    ("[x]", "hydra.sweeper.refit.baselines=[x]"),  # Hydra's own merge refuses a list for the dict
    # A key the config lacks: refused before the search, not by Hydra after it (new-user trial).
    ("{typo:{layerz:1}}", "hydra.sweeper.refit.baselines.typo: 'layerz' is not a key or config group of the task's "
                          "config (did you mean 'layers'?)"),
])
def test_bad_refit_baselines_are_refused_before_anything_runs(tmp_path, value, message):
    res = _run(tmp_path, "x=interval(0,1)", *REFIT, f"hydra.sweeper.refit.baselines={value}")
    assert res.returncode != 0 and message in res.output, res.output[-2000:]
    assert not (tmp_path / "rec").exists()
