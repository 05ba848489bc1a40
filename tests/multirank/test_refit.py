"""Refit and the rerun line at 2 ranks (issue 13; cases C19, C49): the one launch of the refit contract.

One 2-rank torchrun sweep of ``tests/apps/rerun_world_app.py`` (``tests/apps/rerun_app.py``'s task: value
``(x - 0.3)**2 + opt.scale + 0.01 * world size + 0.001 * sum(units) + extra``, where the units are params the
task suggests itself with ``layers=2``; the refit stage adds 10), with fixed overrides (``+extra=1``,
``opt=adam``), a refit of the best trial and two baselines. It shows that every rank runs each refit with the
task-suggested params replayed and each baseline's ``+<name>`` keys, in one dir; the rerun line of the best
trial, pasted into bash, starts the same 2-rank world (rank 1 starting 1.5 s late), runs every rank in the one
run dir the line names and returns ``best_value`` exactly (world size 2, units, extra, adam).

Everything else about refit (which trials, failures, refusals, the results file, a number returned, baselines'
missing keys) is rank 0's and runs in process: ``tests/test_refit.py``; rerun lines at world size 1:
``tests/test_rerun_lines.py``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from tests.torchrun_utils import REPO, base_env, run_command, run_torchrun

pytestmark = [pytest.mark.torchrun]

APP = "tests/apps/rerun_world_app.py"
ADAM_SCALE = yaml.safe_load((REPO / "tests" / "apps" / "conf_rerun" / "opt" / "adam.yaml").read_text())["scale"]
BASELINES = "{at_zero:{x:0.0,+n_units_l0:4,+n_units_l1:8},as_composed:{+n_units_l0:16,+n_units_l1:32}}"


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """The 2-rank sweep with refit; returns its folder (``sweep``, ``rec``)."""
    tmp = tmp_path_factory.mktemp("refit2")
    args = ["-m", f"hydra.sweep.dir={tmp / 'sweep'}", "x=interval(0,1)", "layers=2", "+extra=1", "opt=adam",
            "hydra.sweeper.refit.enabled=true", "hydra.sweeper.refit.overrides=['stage=final']",
            "hydra.sweeper.refit.trials=[best,enqueued]", f"hydra.sweeper.refit.baselines={BASELINES}"]
    res = run_torchrun(APP, args, nproc=2, cwd=tmp, extra_env={"DSO_RECORD_DIR": str(tmp / "rec")}, timeout_s=200)
    res.check()
    (tmp / "output.txt").write_text(res.output)
    return tmp


def _results(tmp: Path) -> dict:
    return yaml.safe_load((tmp / "sweep" / "optimization_results.yaml").read_text())


def _dir(tmp: Path, mode: str, stage: str, tag, rank: int) -> str:
    return json.loads((tmp / "rec" / f"dir_{mode}_{stage}_{tag}_rank{rank}.json").read_text())["output_dir"]


@pytest.mark.timeout(300)
def test_refit_at_two_ranks_replays_task_suggested_params_on_every_rank(swept):
    output = (swept / "output.txt").read_text()
    # 'enqueued' names no trial here (no warm start): said in the log, and the best trial is refit alone.
    assert "refit.trials names 'enqueued', but the study has no COMPLETE trial from" in output
    results = _results(swept)
    best = results["refit"][0]
    assert [r["trial"] for r in results["refit"]] == [results["best_trial"], None, None]
    assert best["state"] == "COMPLETE" and "baseline" not in best
    assert best["metrics"]["test_value"] == results["best_value"] + 10.0  # same units, same world size
    best_units = sorted(v for k, v in results["best_params"].items() if k.startswith("n_units_l"))
    assert len(best_units) == 2 and best["metrics"]["units"] == float(sum(best_units))
    assert best["rerun_command"].startswith("DS_OPTUNA_TRIAL=")
    for rank in (0, 1):  # every rank ran the refit, in its dir
        assert _dir(swept, "sweep", "final", best["trial"], rank) == str(swept / "sweep" / "refit" / str(best["trial"]))
    study = optuna.load_study(study_name="rerun_world_app", storage=f"sqlite:///{swept / 'sweep'}/optuna.db")
    assert len(study.trials) == 3  # refits and baselines are no trials


@pytest.mark.timeout(300)
def test_refit_baselines_run_next_to_the_best_trial_on_every_rank(swept):
    """docs/how-to/refit.md, ``refit.baselines``: named configs that are no trial are trained once more with the refit
    overrides, after the chosen trials, at world size 2, their ``+<name>`` keys answering the task's own
    suggest calls; each gets its own dir (both ranks' job logs in it), results entry (``baseline: <name>``,
    ``trial: null``), rerun line and log line."""
    output = (swept / "output.txt").read_text()
    at_zero, as_composed = _results(swept)["refit"][1:]
    assert at_zero["baseline"] == "at_zero" and as_composed["baseline"] == "as_composed"
    # world size 2: + 0.02; extra 1; units 4 + 8 and 16 + 32
    assert at_zero["metrics"] == {"test_value": pytest.approx(0.09 + ADAM_SCALE + 0.02 + 0.012 + 1 + 10.0), "units": 12.0}
    assert as_composed["metrics"] == {"test_value": pytest.approx(0.04 + ADAM_SCALE + 0.02 + 0.048 + 1 + 10.0),
                                      "units": 48.0}  # x: 0.5 in rerun.yaml
    for number, entry in ((-1, at_zero), (-2, as_composed)):
        job_dir = swept / "sweep" / "refit" / entry["baseline"]
        assert entry["state"] == "COMPLETE" and entry["overrides"][-1] == "stage=final"
        assert entry["job_dir"] == str(job_dir)
        assert f"rerun/refit-{entry['baseline']}" in entry["rerun_command"]
        assert f"Refit of baseline {entry['baseline']} COMPLETE" in output
        assert [_dir(swept, "sweep", "final", number, rank) for rank in (0, 1)] == [str(job_dir)] * 2
        logs = sorted(job_dir.glob("*.log"))
        assert len(logs) == 2 and all(f"refit of baseline {entry['baseline']} COMPLETE" in p.read_text()
                                      for p in logs), logs
    assert "x=0.0" in at_zero["overrides"] and not any(o.startswith("x=") for o in as_composed["overrides"])
    overrides = yaml.safe_load((swept / "sweep" / "refit" / "at_zero" / ".hydra" / "overrides.yaml").read_text())
    assert "x=0.0" in overrides and "stage=final" in overrides and "+n_units_l0=4" in overrides


@pytest.mark.timeout(300)
def test_c19_c49_the_pasted_rerun_line_runs_the_two_rank_trial_in_one_run_dir_and_reproduces_it(swept):
    """C19: the rerun line of a 2-rank trial with task-suggested params and fixed overrides, pasted into bash
    as written, returns ``best_value`` exactly. C49: it starts torchrun (not a multirun) and every rank runs in
    the one run dir it names, ``<sweep dir>/rerun/<trial>``, though rank 1 starts 1.5 s later (each rank's own
    ``${now:...}`` dir would differ): no ``outputs/<date>/<time>`` per rank."""
    results = _results(swept)
    line = results["rerun_command"]
    assert "\n" not in line and line.startswith("DS_OPTUNA_TRIAL=") and " --standalone --nproc_per_node 2 " in line, line
    assert " torchrun " in line or " -m torch.distributed.run " in line, line
    assert " -m " not in line.replace(" -m torch.distributed.run ", " "), line
    assert "+extra=1" in line and "opt=adam" in line and "n_units_l0=" not in line.split("rerun_world_app.py", 1)[1]
    env = base_env(DSO_RECORD_DIR=str(swept / "pasted"), DSO_DELAY_RANK="1", DSO_DELAY_S="1.5",
                   PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    run_command(["bash", "-c", line], timeout_s=150, cwd=swept, env=env).check()
    value = json.loads((swept / "pasted" / "value_single_search_run.json").read_text())["value"]
    assert value == results["best_value"]  # exactly: world size 2, units, extra, adam
    dirs = [json.loads((swept / "pasted" / f"dir_single_search_run_rank{r}.json").read_text())["output_dir"]
            for r in (0, 1)]
    assert dirs == [str(swept / "sweep" / "rerun" / str(results["best_trial"]))] * 2, dirs
    assert not (swept / "outputs").exists()
