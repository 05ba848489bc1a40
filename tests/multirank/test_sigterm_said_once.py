"""SIGTERM with ``n_jobs=2``: "received SIGTERM" and the resume command said once (issue 38, C59).

Two ranks, two single-rank trial groups (the DDP example, a checkpoint every epoch); SIGTERM to torchrun while
both trials train. Every rank of a trial group is its group's rank 0, so each said "rank 0 received SIGTERM"
and the resume command was printed twice.
"""

import os
import signal
from pathlib import Path

import pytest

from tests.multirank.test_preemption import DDP_APP, _wait_for
from tests.torchrun_utils import REPO, base_env, start_process, torchrun_command, wait_process

pytestmark = pytest.mark.torchrun


def _launch(tmp_path: Path, args: list[str]):
    """``torchrun examples/ddp_mlp.py -m args``, output in ``tmp_path/run.log``, this checkout's package first."""
    log_path = tmp_path / "run.log"
    env = base_env(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "apps")]))
    proc = start_process(torchrun_command(DDP_APP, ["-m", *args]), cwd=REPO, env=env, stdout=log_path.open("w"))
    return proc, log_path


@pytest.mark.timeout(240)
def test_sigterm_with_two_trial_groups_says_it_and_the_resume_command_once(tmp_path: Path) -> None:
    args = [f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2", "epochs=4",
            "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=60", "model.n_layers=choice(2)",
            "lr=choice(0.01,0.02)", "step_sleep_s=0.1"]
    proc, log_path = _launch(tmp_path, args)
    _wait_for(lambda: log_path.read_text().count("epoch 1: val accuracy") >= 1, 150, proc, log_path, "epoch 1")
    os.kill(proc.pid, signal.SIGTERM)
    wait_process(proc, 90)
    text = log_path.read_text()
    received = [ln for ln in text.splitlines() if "received SIGTERM" in ln]
    assert len(received) == 1, "\n".join(received) + "\n----\n" + text[-5000:]
    resume = [ln for ln in text.splitlines() if f"hydra.sweep.dir={tmp_path / 'sweep'}" in ln and "ddp_mlp.py" in ln]
    assert len(resume) == 1, "\n".join(resume) + "\n----\n" + text[-5000:]
