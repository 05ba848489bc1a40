"""The edges of a sweep that rank 0 alone decides (issue 12, cases C18-C27), run in process at world size 1
(``tests/in_process.py``): set-up refusals with nothing stored, the resume hint and the failure-rate stop,
seeded samplers on resume, a trial another worker closed, report() in a multi-objective study.

What crosses ranks in these cases keeps its torchrun launch: the failure-rate stop ending every rank's process
and the torchrun form of the resume command (``tests/faults/test_faults.py``), a refusal seen by every rank
(``tests/multirank``). The start-up races of several groups on one storage (C17, C29, C30) are soak tests:
``tests/faults/test_start_up_races.py``.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study._stored import RUNS_ATTR
from hydra_plugins.ds_optuna_sweeper._study._study import run_seed
from tests.in_process import run_app, sweep
from tests.multirank.sweep_helpers import load

C, F = TrialState.COMPLETE, TrialState.FAIL


def _edge(tmp_path: Path, *overrides: str, env: dict | None = None):
    """``python edge_app.py -m ...`` in process (``tests/apps/edge_app.py``: a task that misuses what the
    sweeper owns in trial ``misuse_trial``)."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    return run_app("edge_app", args, config_name="edge", env={"DSO_RECORD_DIR": str(tmp_path / "records"),
                                                              **(env or {})})


def _edge_study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="edge_app", storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")


# --- C18: seeded samplers on resume ---------------------------------------------------------------------


@pytest.mark.parametrize("sampler", ["random", "tpe", "qmc"])
def test_c18_a_seeded_sampler_never_replays_itself_on_resume(tmp_path, sampler):
    common = ["x=interval(-1,1)", f"hydra/sweeper/sampler={sampler}", "hydra.sweeper.sampler.seed=7"]
    sweep(tmp_path / "a", *common, "hydra.sweeper.n_trials=2").check()
    sweep(tmp_path / "a", *common, "hydra.sweeper.n_trials=4").check()
    xs = [t.params["x"] for t in load(tmp_path / "a").trials]
    assert len(xs) == 4 and not set(xs[:2]) & set(xs[2:]), xs  # no replay
    sweep(tmp_path / "b", *common, "hydra.sweeper.n_trials=2").check()
    assert [t.params["x"] for t in load(tmp_path / "b").trials] == xs[:2]  # a new study is reproducible
    assert load(tmp_path / "a").user_attrs[RUNS_ATTR] == 2


def test_run_seed_rule():
    # The README's rule (Resume): run k > 0 uses the first 4 bytes of sha256("<seed>/<k>"), as an
    # unsigned big-endian integer.
    assert run_seed(7, 3) == int.from_bytes(hashlib.sha256(b"7/3").digest()[:4], "big") == 1698595815
    assert run_seed(7, 0) == 7
    seeds = {run_seed(7, k) for k in range(1, 50)}
    assert len(seeds) == 49 and 7 not in seeds and all(0 <= s < 2**32 for s in seeds)
    assert run_seed(7, 3) == run_seed(7, 3) != run_seed(8, 3)


# --- C20: heartbeats --------------------------------------------------------------------------------------


def test_c20_grace_period_not_longer_than_the_heartbeat_is_refused_before_anything_is_stored(tmp_path):
    res = sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.heartbeat_interval=3", "hydra.sweeper.grace_period=1")
    assert res.returncode != 0
    assert "hydra.sweeper.grace_period=1 s is not longer than hydra.sweeper.heartbeat_interval=3 s" in res.output
    assert "Use grace_period >= 6" in res.output
    assert not (tmp_path / "sweep" / "optuna.db").exists()


def test_c20_a_trial_another_worker_closed_is_logged_and_counted_never_fatal(tmp_path):
    env = {"DSO_STORAGE": f"sqlite:///{tmp_path / 'sweep'}/optuna.db", "DSO_STUDY": "edge_app"}
    res = _edge(tmp_path, "x=interval(-1,1)", "misuse=close_own_trial", "misuse_trial=1", env=env).check()
    assert "Trial 1 was already closed (FAIL) by another worker of the study" in res.output
    assert [t.state for t in _edge_study(tmp_path).trials] == [C, F, C]


# --- C21, C22, C26: bad input refused at set-up, nothing stored ------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["+hydra.sweeper.params={label:[a,b],lr:[0.1,0.01]}"],
         "'label' is a YAML list (['a', 'b']); 'lr' is a YAML list ([0.1, 0.01]). Write 'label: choice(a, b)', "
         "'lr: choice(0.1, 0.01)'"),
        (["+hydra.sweeper.params={model:{hidden:16}}"], "'model' is a YAML mapping"),
        (["+optimizer=choice(adamw,lion)"],
         "'+optimizer=choice(adamw,lion)': no option ['lion'] in config group 'optimizer' (available: ['adamw', 'sgd'])"),
        (["x=interval(0,1)", "+optimizer=choice(adamw,sgd)", "y=choice(1,2)"], None),  # all options exist: runs
        (["x=interval(0,1)", "hydra.sweeper.sampler._target_=optuna.samplers.RandomSampler"],
         "that optuna.samplers.RandomSampler does not take (its arguments: seed): a key added to "
         "hydra.sweeper.sampler, or the keys of another hydra/sweeper/sampler option kept when _target_ was "
         "changed. Choose the class with hydra/sweeper/sampler=random"),
        # A key added to the chosen option (new-user trial: the message spoke only of a changed _target_).
        (["x=interval(0,1)", "hydra/sweeper/pruner=nop", "+hydra.sweeper.pruner.n_warmup_steps=1"],
         "hydra.sweeper.pruner has key(s) ['n_warmup_steps'] that optuna.pruners.NopPruner does not take (its "
         "arguments: none): a key added to hydra.sweeper.pruner"),
        (["x=interval(0,1)", "hydra/sweeper/pruner=median", "hydra.sweeper.pruner._target_=optuna.pruners.NopPruner"],
         "Choose the class with hydra/sweeper/pruner=nop"),
        (["x=interval(0,1)", "hydra/sweeper/sampler=random", "hydra.sweeper.sampler._target_=optuna.samplers.TPESampler"],
         None),  # keys that fit the new target: fine
    ],
)
def test_c21_c22_c26_bad_input_is_refused_before_trial_0_with_nothing_stored(tmp_path, overrides, expected):
    res = sweep(tmp_path, "hydra.sweeper.n_trials=2", *overrides)
    if expected is None:
        res.check()
        assert len(load(tmp_path).trials) == 2
        return
    assert res.returncode != 0
    assert expected in res.output.replace("\n", " ")
    db = tmp_path / "sweep" / "optuna.db"
    assert not db.exists() or not optuna.get_all_study_names(f"sqlite:///{db}")
    assert not (tmp_path / "records").exists()


def test_c22_a_missing_group_option_is_refused_and_an_existing_study_keeps_its_trials(tmp_path):
    """(Refused on every rank alike: the refusal contract of ``tests/multirank``.)"""
    sweep(tmp_path, "x=interval(0,1)", "hydra.sweeper.n_trials=2").check()
    before = [(t.number, t.state, t.params) for t in load(tmp_path).trials]
    res = sweep(tmp_path, "x=interval(0,1)", "hydra.sweeper.n_trials=4", "+optimizer=choice(adamw,lion)")
    assert res.returncode != 0
    assert "no option ['lion'] in config group 'optimizer'" in res.output
    assert [(t.number, t.state, t.params) for t in load(tmp_path).trials] == before


# --- C23: the resume hint after the failure-rate stop ----------------------------------------------------------


def test_c23_the_failure_rate_stop_prints_the_exact_command_that_continues_the_study(tmp_path):
    """max_failure_rate=0 (the default): the first failed trial stops the sweep, the message says failed trials
    count against n_trials, and the resume command pins the sweep dir (the default one has a timestamp: "run
    the same command" would start a new study). Pasted without the injected failure, it continues the same
    study. (The torchrun form of the command and every rank's exit: ``tests/faults/test_faults.py``.)"""
    res = run_app("sweep_app", ["-m", "hydra.sweeper.n_trials=4", "x=interval(-1,1)", "fail_on_rank=0",
                                "fail_on_trial=1", "hydra.sweeper.plots=false"],
                  config_name="app", cwd=tmp_path, env={"DSO_RECORD_DIR": str(tmp_path / "r")})
    assert res.returncode == 1, res.output[-3000:]
    assert "TrialFailedError: 1 of 2 trials of this run failed (failure rate 0.50 > " \
           "hydra.sweeper.max_failure_rate=0.0)" in res.output
    assert "failed ones count against hydra.sweeper.n_trials=4 (raise it to run as many new ones)" in res.output
    command = res.output.split("resume with: ", 1)[1].splitlines()[0].strip().rstrip(")")
    argv = shlex.split(command)
    script = next(i for i, a in enumerate(argv) if a.endswith("sweep_app.py"))
    sweep_dir = next(a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir="))
    assert Path(sweep_dir).parent.parent == tmp_path / "multirun", sweep_dir
    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{sweep_dir}/optuna.db")
    assert [t.state for t in study.trials] == [C, F]
    pasted = [a for a in argv[script + 1:] if not a.startswith(("fail_on_rank=", "fail_on_trial="))]
    run_app("sweep_app", pasted, config_name="app", cwd=tmp_path, env={"DSO_RECORD_DIR": str(tmp_path / "r")}).check()
    study = optuna.load_study(study_name="sweep_app", storage=f"sqlite:///{sweep_dir}/optuna.db")
    assert [t.state for t in study.trials] == [C, F, C, C]


# --- C27: misuse inside the task ----------------------------------------------------------------------------


def test_c27_report_in_a_multi_objective_study_says_why(tmp_path):
    """(On every rank: each rank's own task raises; the agreed FAIL is the contract of
    ``tests/faults/test_faults.py``.)"""
    res = _edge(tmp_path, "x=interval(-1,1)", "misuse=report", "n_objectives=2", "hydra.sweeper.max_failure_rate=1.0",
                "hydra.sweeper.direction=[minimize,maximize]").check()
    msg = "report() needs a single-objective study, but this study has 2 directions"
    assert "NotImplementedError: trial 1: " + msg in res.output, res.output[-3000:]
    assert [t.state for t in _edge_study(tmp_path).trials] == [C, F, C]
