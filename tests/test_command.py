"""The launcher part of rerun and resume lines (``_command.py``), with ``PATH`` forced per case.

README Results: the rerun line starts with "the launcher (``python``, or ``torchrun --standalone
--nproc_per_node N``, written as ``<python> -m torch.distributed.run ...`` when ``torchrun`` is not on
your ``PATH``)". The builder reads torchrun's environment (``TORCHELASTIC_RUN_ID``, ``LOCAL_WORLD_SIZE``,
``WORLD_SIZE``) and looks ``torchrun``/``python`` up on ``PATH``; both are set here as torchrun and a
shell would set them. The ``<python> -m torch.distributed.run`` launcher is then run for real.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_plugins.ds_optuna_sweeper._study._command import launcher, rerun_line, resume_advice, resume_command

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
