"""Refit (issue 13) as rank 0 decides it: which trials and baselines are refit, with which overrides, what the
results file and the log say, and what is refused before anything runs. In process at world size 1
(``tests/in_process.py``, ``tests/rerun_in_process.py``) with ``tests/apps/rerun_app.py``; that every rank runs
each refit (task-suggested params replayed, baselines) is the one 2-rank launch in
``tests/multirank/test_refit.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.rerun_in_process import paste_in_process, run_rerun_app

pytestmark = [pytest.mark.timeout(120)]

REFIT = ["hydra.sweeper.refit.enabled=true", "hydra.sweeper.refit.overrides=['stage=final']"]


def _run(tmp_path: Path, *args: str):
    """``python tests/apps/rerun_app.py -m hydra.sweep.dir=<tmp>/sweep *args`` in process, in ``tmp_path``."""
    return run_rerun_app(["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *args], cwd=tmp_path,
                         env={"DSO_RECORD_DIR": str(tmp_path / "rec")})


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


def test_a_failing_refit_exits_non_zero_and_keeps_the_search(tmp_path):
    """A refit that raises: exit 1, said once (not under a traceback: issue 38, C59), the results file names the
    failure and the searched trials stay. That every rank exits 1 with it: the agreed-failure contract
    (``tests/multirank``, which also checks torchrun's report of rank 0's line)."""
    res = _run(tmp_path, "x=interval(0,1)", *REFIT, "fail_final=true")
    assert res.returncode == 1, res.output[-4000:]
    assert res.output.count("ds_optuna stopped the sweep: TrialFailedError: refit failed (trial") == 1, res.output[-4000:]
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
    """docs/how-to/refit.md: "The task may return a number" (or a dict of metrics); a number is written as
    ``metrics: {value: x}`` (the dict form is the other tests')."""
    res = _run(tmp_path, "x=interval(0,1)", *REFIT, "+final_returns_number=true").check()
    results = _results(tmp_path)
    (entry,) = results["refit"]
    assert entry["trial"] == results["best_trial"] and entry["state"] == "COMPLETE"
    assert entry["metrics"] == {"value": results["best_value"] + 10.0}, entry
    assert f"Refit of trial {entry['trial']} COMPLETE: metrics {{'value': " in res.output
    recorded = json.loads((tmp_path / "rec" / f"value_sweep_final_{entry['trial']}.json").read_text())["value"]
    assert entry["metrics"]["value"] == recorded


def test_a_baseline_answers_the_tasks_own_suggest_calls_with_its_plus_keys(tmp_path):
    """docs/how-to/refit.md: a task that suggests a param itself gets, in a baseline, the value of the baseline's
    ``+<name>`` key; a baseline without it fails with a message that says how to give one (a new user got
    "DS_OPTUNA_TRIAL replays trial -1 ... the task's suggest_* calls changed since the sweep", and the
    README's advice could not be followed). The baseline's rerun line reproduces its value."""
    res = _run(tmp_path, "x=interval(0,1)", "layers=1", *REFIT, "hydra.sweeper.n_trials=2",
               "hydra.sweeper.refit.baselines={wide:{+n_units_l0:100},bare:{}}")
    assert res.returncode != 0
    wide, bare = _results(tmp_path)["refit"][1:]
    scale = yaml.safe_load((Path(__file__).parent / "apps" / "conf_rerun" / "opt" / "sgd.yaml").read_text())["scale"]
    assert wide["state"] == "COMPLETE" and wide["metrics"]["units"] == 100.0
    assert wide["metrics"]["test_value"] == pytest.approx(0.04 + scale + 0.01 + 0.1 + 10.0)
    assert bare["state"] == "FAIL", bare
    assert ("baseline bare answers suggest_* only with its own values [], but the task asked for 'n_units_l0': "
            "give it a value in the baseline, e.g. hydra.sweeper.refit.baselines.bare={+n_units_l0:<value>}"
            in bare["error"]), bare["error"]
    assert "changed since the sweep" not in res.output
    assert paste_in_process(tmp_path, wide["rerun_command"], stage="final") == wide["metrics"]["test_value"]


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
