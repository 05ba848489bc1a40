"""The launcher part of rerun and resume lines (``_command.py``), with ``PATH`` forced per case.

docs/reference/results.md: the rerun line starts with "the launcher (``python``, or ``torchrun --standalone
--nproc_per_node N``, written as ``<python> -m torch.distributed.run ...`` when ``torchrun`` is not on
your ``PATH``)". The builder reads torchrun's environment (``TORCHELASTIC_RUN_ID``, ``LOCAL_WORLD_SIZE``,
``WORLD_SIZE``) and looks ``torchrun``/``python`` up on ``PATH``; both are set here as torchrun and a
shell would set them. The ``<python> -m torch.distributed.run`` launcher is then run for real.

Tables for the rerun/resume command text of ``_study/_command.py`` (issue 39 item 4: rows that kill its mutants).

The rules (module docstrings; torch.distributed.run documentation for torchrun's environment; README Results):
the launcher is ``torchrun --standalone --nproc_per_node L`` on one node and ``--nnodes N --nproc_per_node L`` on
several, ``python`` without torchrun (a rerun line: a one-process torchrun); Hydra's config flags are kept; the
sweep's own ``hydra.*`` overrides are dropped from a rerun line; a rerun runs in ``<sweep dir>/rerun/<trial>``
(case C49); params the task suggested itself travel in ``DS_OPTUNA_TRIAL`` (case C19).
PATH holds this environment's bin dir, so ``python`` and ``torchrun`` are written as such.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_plugins.ds_optuna_sweeper._study._command import (
    CONFIG_FLAGS,
    RerunContext,
    SWEEP_ONLY_OVERRIDES,
    _relative,
    app_arguments,
    command_line,
    config_flags,
    launcher,
    rerun_dir,
    rerun_line,
    restart_pending,
    resume_advice,
    resume_command,
    split_params,
    trial_entry,
    trial_overrides,
    trial_rerun_line,
)
import json
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space

VENV_BIN = Path(sys.executable).parent  # this environment's bin dir: python and its torchrun entry point


@pytest.fixture
def under_torchrun(monkeypatch):
    """The environment torchrun gives a worker of ``--standalone --nproc_per_node 2``."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(sys, "argv", ["tests/apps/sweep_app.py", "-m", "hydra.sweeper.n_trials=3", "x=interval(0,1)"])


def _is_this_python(word: str) -> bool:
    return word != "python" and os.path.realpath(word) == os.path.realpath(sys.executable)


def test_without_torchrun_on_path_the_rerun_line_is_python_dash_m_torch_distributed_run(
        under_torchrun, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither torchrun nor python here
    words = launcher()
    assert _is_this_python(words[0]), words
    assert words[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    line = rerun_line(["x=0.25"], env={"DS_OPTUNA_TRIAL": '{"number": 1, "params": {}}'})
    assert line == (f"DS_OPTUNA_TRIAL='{{\"number\": 1, \"params\": {{}}}}' {shlex.quote(words[0])} -m "
                    "torch.distributed.run --standalone --nproc_per_node 2 tests/apps/sweep_app.py x=0.25")
    # The launcher runs as written (from the repository root, where the relative interpreter path points).
    proc = subprocess.run([*words[:3], "--help"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0 and "--nproc-per-node" in proc.stdout, proc.stderr[-2000:]


def test_another_environments_torchrun_on_path_is_not_used(under_torchrun, monkeypatch, tmp_path):
    other = tmp_path / "other_env_bin"
    other.mkdir()
    (other / "torchrun").write_text("#!/bin/sh\nexit 1\n")
    (other / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", str(other))
    words = launcher()
    assert _is_this_python(words[0]) and words[1:3] == ["-m", "torch.distributed.run"], words


def test_this_environments_torchrun_on_path_is_written_as_torchrun(under_torchrun, monkeypatch):
    """An activated venv: its bin dir, holding python (a symlink to the base interpreter) and torchrun."""
    assert (VENV_BIN / "torchrun").exists(), "this environment has no torchrun entry point"
    monkeypatch.setenv("PATH", str(VENV_BIN))
    assert launcher() == ["torchrun", "--standalone", "--nproc_per_node", "2"]
    assert rerun_line(["x=0.25"]) == "torchrun --standalone --nproc_per_node 2 tests/apps/sweep_app.py x=0.25"


def test_several_nodes_give_nnodes_and_nproc_per_node(under_torchrun, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert launcher()[1:] == ["-m", "torch.distributed.run", "--nnodes", "4", "--nproc_per_node", "2"]


def test_without_torchrun_the_launcher_is_python_or_this_interpreters_path(monkeypatch, tmp_path):
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(VENV_BIN))
    assert launcher() == ["python"]
    # a rerun line recreates the one-process torchrun world each trial of the sweep ran in
    assert launcher(rerun=True) == ["torchrun", "--standalone", "--nproc_per_node", "1"]
    monkeypatch.setenv("PATH", str(tmp_path))
    (word,) = launcher()
    assert _is_this_python(word)


@pytest.mark.parametrize("count,most,pending", [(None, None, False), ("0", "0", False), ("0", "1", True),
                                                ("1", "1", False), ("1", "3", True), ("x", "1", False)])
def test_resume_advice_says_when_torchrun_restarts_the_group_itself(under_torchrun, monkeypatch, count, most, pending):
    """A new user was told to resume while ``--max-restarts`` was restarting the group: pasting it then would
    put two launches on one study. With a restart left the advice says so first; the command stays on its own
    line after "Resume the study with:" either way."""
    for name, value in (("TORCHELASTIC_RESTART_COUNT", count), ("TORCHELASTIC_MAX_RESTARTS", most)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    text = resume_advice("/s")
    assert text.endswith("Resume the study with:\n" + resume_command("/s"))
    said = f"torchrun restarts the group now (restart {int(count) + 1} of {most}, --max-restarts)" if pending else None
    assert (said in text) if pending else text.startswith("Resume the study with:"), text


VENV_BIN_TEXT = str(Path(sys.executable).parent)
ENV_NAMES = ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "DS_OPTUNA_LAUNCH_WORLD",
             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


@pytest.fixture
def env(monkeypatch):
    """No torchrun variables, this environment's bin dir on PATH, a known argv; returns a setter."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", VENV_BIN_TEXT)
    monkeypatch.setattr(sys, "argv", ["app.py", "-m", "x=interval(0,1)"])

    def set_env(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    return set_env


@pytest.mark.parametrize("variables, rerun, words", [
    ({}, False, ["python"]),
    ({}, True, ["torchrun", "--standalone", "--nproc_per_node", "1"]),
    ({"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, False,
     ["torchrun", "--standalone", "--nproc_per_node", "2"]),
    ({"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, True,
     ["torchrun", "--standalone", "--nproc_per_node", "2"]),
    ({"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "4"}, False,    # WORLD_SIZE unset: one node
     ["torchrun", "--standalone", "--nproc_per_node", "4"]),
    ({"TORCHELASTIC_RUN_ID": "j1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "6"}, False,
     ["torchrun", "--nnodes", "3", "--nproc_per_node", "2"]),
    ({"TORCHELASTIC_RUN_ID": "", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, False,  # set, even empty
     ["torchrun", "--standalone", "--nproc_per_node", "2"]),
    ({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, False, ["python"]),   # no TORCHELASTIC_RUN_ID: not torchrun
    ({"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": ""}, False, ["python"]),
    # trial groups: a resume line names the launch's world, a rerun line the group's (one trial's) world
    ({"DS_OPTUNA_LAUNCH_WORLD": "4/4", "TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"},
     False, ["torchrun", "--standalone", "--nproc_per_node", "4"]),
    ({"DS_OPTUNA_LAUNCH_WORLD": "8/4", "TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"},
     False, ["torchrun", "--nnodes", "2", "--nproc_per_node", "4"]),
    ({"DS_OPTUNA_LAUNCH_WORLD": "4/4", "TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"},
     True, ["torchrun", "--standalone", "--nproc_per_node", "2"]),
    ({"DS_OPTUNA_LAUNCH_WORLD": "", "TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"},
     False, ["torchrun", "--standalone", "--nproc_per_node", "2"]),
])
def test_launcher(env, variables, rerun, words):
    env(**variables)
    assert launcher(rerun=rerun) == words


def test_launcher_on_several_nodes_when_local_is_zero_divides_by_one(env):
    env(DS_OPTUNA_LAUNCH_WORLD="4/0")
    assert launcher() == ["torchrun", "--nnodes", "4", "--nproc_per_node", "0"]


@pytest.mark.parametrize("argv, flags", [
    (["app.py", "--config-name", "train", "x=1"], ["--config-name", "train"]),
    (["app.py", "-cn", "train", "-cp", "conf", "-cd", "extra"], ["-cn", "train", "-cp", "conf", "-cd", "extra"]),
    (["app.py", "--config-path=conf", "--config-dir=d", "x=1"], ["--config-path=conf", "--config-dir=d"]),
    (["app.py", "-m", "--config-name"], []),                 # a flag without its value is left out
    (["app.py", "--config-name", "--config-path", "c"], ["--config-name", "--config-path"]),
    (["app.py", "-cn=t", "--config-name2=x", "x=--config-name"], ["-cn=t"]),
    (["app.py", "--config-name=a=b"], ["--config-name=a=b"]),   # the flag is what comes before the first '='
    (["app.py"], []),
])
def test_config_flags(monkeypatch, argv, flags):
    monkeypatch.setattr(sys, "argv", argv)
    assert config_flags() == flags


def test_constants():
    assert CONFIG_FLAGS == ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")
    assert SWEEP_ONLY_OVERRIDES == ("hydra.sweep", "hydra/sweeper", "hydra.sweeper", "hydra.mode", "hydra/launcher",
                                    "hydra.launcher", "hydra.output_subdir", "hydra.job_logging.handlers.file.filename")


@pytest.mark.parametrize("argv, extra, args", [
    (["app.py", "-m", "x=1", "y=2"], [], ["app.py", "-m", "x=1", "y=2"]),
    (["app.py", "-m", "x=1", "hydra.sweep.dir=old"], ["hydra.sweep.dir=/new"],
     ["app.py", "-m", "x=1", "hydra.sweep.dir=/new"]),                 # replaced, at the end
    (["app.py", "x=1"], ["a=b=c"], ["app.py", "x=1", "a=b=c"]),
    (["app.py", "a=1", "a.b=2"], ["a=3"], ["app.py", "a.b=2", "a=3"]),  # the key before the first '='
    (["app.py", "a=1"], ["a=b=c"], ["app.py", "a=b=c"]),
    (["app.py", "a=x=y", "b=1"], ["a=2"], ["app.py", "b=1", "a=2"]),
    ([""], [], ["<your app>.py"]),
    ([], ["k=v"], ["<your app>.py", "k=v"]),
])
def test_app_arguments(monkeypatch, argv, extra, args):
    monkeypatch.setattr(sys, "argv", argv)
    assert app_arguments(extra) == args


def test_relative_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert _relative(str(tmp_path / "sub" / "app.py")) == "sub/app.py"
    assert _relative("/elsewhere/app.py") == "/elsewhere/app.py"   # not under the working dir: kept absolute
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "sub" / "app.py"), "x=1"])
    assert app_arguments() == ["sub/app.py", "x=1"]


@pytest.mark.parametrize("hydra_overrides, run_dir, expected", [
    ((), None, "torchrun --standalone --nproc_per_node 1 app.py --config-name t x=1 'y=a b'"),
    (("hydra.sweep.dir=/s", "hydra/sweeper=ds_optuna", "hydra.sweeper.n_trials=3", "hydra.mode=MULTIRUN",
      "hydra/launcher=basic", "hydra.launcher.n_jobs=2", "hydra.output_subdir=null",
      "hydra.job_logging.handlers.file.filename=x.log", "+hydra.sweeper.seed=1", "~hydra.sweep.subdir",
      "hydra.job.chdir=true", "+hydra.verbose=true"), None,
     "torchrun --standalone --nproc_per_node 1 app.py --config-name t hydra.job.chdir=true +hydra.verbose=true x=1 "
     "'y=a b'"),
    ((), "/s/rerun/3", "torchrun --standalone --nproc_per_node 1 app.py --config-name t hydra.run.dir=/s/rerun/3 "
                       "x=1 'y=a b'"),
    ((), "/s d/${x}", "torchrun --standalone --nproc_per_node 1 app.py --config-name t "
                      "'hydra.run.dir=/s d/\\${x}' x=1 'y=a b'"),
    (("hydra.run.dir=/mine",), "/s/rerun/3",
     "torchrun --standalone --nproc_per_node 1 app.py --config-name t hydra.run.dir=/mine x=1 'y=a b'"),
    (("+hydra.run.dir=/mine",), "/s/rerun/3",
     "torchrun --standalone --nproc_per_node 1 app.py --config-name t +hydra.run.dir=/mine x=1 'y=a b'"),
    (("hydra.run.dir_x=1",), "/r", "torchrun --standalone --nproc_per_node 1 app.py --config-name t "
                                   "hydra.run.dir_x=1 hydra.run.dir=/r x=1 'y=a b'"),
])
def test_rerun_line(env, monkeypatch, hydra_overrides, run_dir, expected):
    monkeypatch.setattr(sys, "argv", ["app.py", "-m", "--config-name", "t", "x=interval(0,1)"])
    assert rerun_line(["x=1", "y=a b"], hydra_overrides, run_dir=run_dir) == expected


def test_rerun_line_sets_the_environment_first(env):
    line = rerun_line(["x=1"], env={"A": "1", "DS_OPTUNA_TRIAL": '{"n": 1}'})
    assert line == "A=1 DS_OPTUNA_TRIAL='{\"n\": 1}' torchrun --standalone --nproc_per_node 1 app.py x=1"
    assert rerun_line(["x=1"], env={}) == "torchrun --standalone --nproc_per_node 1 app.py x=1"


def test_command_line_and_resume_command(env):
    assert command_line() == "python app.py -m 'x=interval(0,1)'"
    assert command_line(["y=2"]) == "python app.py -m 'x=interval(0,1)' y=2"
    assert resume_command("/tmp/s 1/${now:x}") == ("python app.py -m 'x=interval(0,1)' "
                                                    "'hydra.sweep.dir=/tmp/s 1/\\${now:x}'")


@pytest.mark.parametrize("count, most, pending", [
    (None, "3", None), ("0", None, None), ("0", "0", None), ("0", "1", (1, 1)), ("1", "1", None),
    ("2", "3", (3, 3)), ("3", "3", None), ("4", "3", None), ("x", "3", None), ("1", "y", None), ("", "1", None),
])
def test_restart_pending(env, monkeypatch, count, most, pending):
    if count is not None:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", count)
    if most is not None:
        monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", most)
    assert restart_pending() == pending


def test_resume_advice_text(env):
    line = "python app.py -m 'x=interval(0,1)' hydra.sweep.dir=/s"
    assert resume_advice("/s") == f"Resume the study with:\n{line}"
    env(TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="2")
    assert resume_advice("/s") == (
        "torchrun restarts the group now (restart 1 of 2, --max-restarts) and the restarted group resumes the "
        f"study by itself; only if it does not, Resume the study with:\n{line}")


@pytest.mark.parametrize("sweep_dir, number, refit, path", [
    ("/s", 3, False, "/s/rerun/3"),
    ("/s/", 3, True, "/s/rerun/refit-3"),
    ("rel", "base", True, "rel/rerun/refit-base"),
    ("rel", "base", False, "rel/rerun/base"),
])
def test_rerun_dir(sweep_dir, number, refit, path):
    assert rerun_dir(sweep_dir, number, refit=refit) == path


def _trial(params, user_attrs=None, number=4, values=(0.5,)):
    dists = {k: FloatDistribution(0, 10) if isinstance(v, float) else CategoricalDistribution([v])
             for k, v in params.items()}
    return FrozenTrial(number=number, state=TrialState.COMPLETE, value=None, values=list(values),
                       datetime_start=None, datetime_complete=None, params=params, distributions=dists,
                       user_attrs=user_attrs or {}, system_attrs={}, intermediate_values={}, trial_id=number)


SPACE = build_search_space({"model.lr": "interval(0,10)"}, ["seed=1", "opt=choice(a,b)"])


@pytest.mark.parametrize("params, attrs, space, overrides, task", [
    # the space's params are overrides (key as typed), the others the task's own
    ({"model.lr": 2.5, "opt": "b", "wd": 0.1}, {}, SPACE, {"model.lr": 2.5, "opt": "b"}, {"wd": 0.1}),
    # custom_search_space's params are stored as override params
    ({"model.lr": 2.5, "extra": 1.0}, {"ds_optuna:override_params": ["extra"]}, SPACE,
     {"model.lr": 2.5, "extra": 1.0}, {}),
    # no space (a results file written by an older run): every param is an override
    ({"a": 1.0, "b": "x"}, {}, None, {"a": 1.0, "b": "x"}, {}),
])
def test_split_params(params, attrs, space, overrides, task):
    assert split_params(_trial(params, attrs), space) == (overrides, task)


@pytest.mark.parametrize("params, attrs, space, lines, task", [
    ({"model.lr": 2.5, "opt": "b", "wd": 0.1}, {}, SPACE, ["seed=1", "model.lr=2.5", "opt=b"], {"wd": 0.1}),
    # the fixed overrides of the run that asked the trial, stored with it, win over the current run's
    ({"model.lr": 2.5}, {"ds_optuna:fixed_overrides": ["seed=7", "+x=y"]}, SPACE,
     ["seed=7", "+x=y", "model.lr=2.5"], {}),
    ({"a": 1.0, "b": "x y"}, {"ds_optuna:fixed_overrides": ["seed=7"]}, None, ["a=1.0", "b=x y"], {}),
])
def test_trial_overrides(params, attrs, space, lines, task):
    assert trial_overrides(_trial(params, attrs), space) == (lines, task)


def test_trial_entry_and_rerun_line(env):
    trial = _trial({"model.lr": 2.5, "opt": "b", "wd": 0.25}, number=4, values=(0.5, 1.5))
    ctx = RerunContext(SPACE, ("hydra.sweeper.n_trials=3", "hydra.job.chdir=true"), "/s")
    replay = json.dumps({"number": 4, "params": {"wd": 0.25}})
    rerun = (f"DS_OPTUNA_TRIAL='{replay}' torchrun --standalone --nproc_per_node 1 app.py hydra.job.chdir=true "
             "hydra.run.dir=/s/rerun/4 seed=1 model.lr=2.5 opt=b")
    assert trial_rerun_line(trial, ctx) == rerun
    assert trial_entry(trial, ctx) == {
        "number": 4, "values": [0.5, 1.5], "params": {"model.lr": 2.5, "opt": "b", "wd": 0.25},
        "overrides": ["seed=1", "model.lr=2.5", "opt=b"], "override_line": "seed=1 model.lr=2.5 opt=b",
        "rerun_command": rerun}


def test_trial_rerun_line_without_task_params_or_sweep_dir(env):
    trial = _trial({"a": 1.0, "b": "x y"}, number=2)
    assert trial_rerun_line(trial, RerunContext(None)) == "torchrun --standalone --nproc_per_node 1 app.py a=1.0 'b=x y'"
    assert trial_entry(trial, RerunContext(None))["override_line"] == "a=1.0 'b=x y'"


def test_a_resume_line_on_several_nodes_says_to_add_the_rendezvous_flags(under_torchrun, monkeypatch, tmp_path):
    """The ranks never see torchrun's rendezvous flags: the line ends with a shell comment asking for them on every
    node (the two-namespace tests of issue 42 found the printed line unusable as it was)."""
    from hydra_plugins.ds_optuna_sweeper._study._command import resume_command

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    line = resume_command(str(tmp_path))
    assert "--nnodes 2 --nproc_per_node 2" in line
    assert line.endswith("  # on every node, with your rendezvous flags: --rdzv-backend c10d --rdzv-endpoint "
                         "<host>:<port> --rdzv-id <a new id>")
