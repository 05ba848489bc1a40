"""Case C39: a plain DDP task runs at world size 1 with ``python app.py -m``, the same code as under torchrun.

The task creates the default process group only when none exists (``if not dist.is_initialized():``)
and wraps its model in ``DistributedDataParallel``. Without torchrun that guarded call used ``env://``
and failed every trial ("environment variable RANK expected, but not set"); the sweeper now creates a
one-process default group and sets torchrun's variables that are unset (docs/tutorial/ddp-sweep.md, "Your task and the
process group").

The sweep of the test app runs in process (``tests/in_process.py``, issue 39 item 1): the one-process group is
the sweeper's in this process as in ``python app.py``. The rerun line it writes is pasted into bash, a real
one-process torchrun launch; the example's own ``python examples/ddp_mlp.py -m`` is a process of its own
(``run_python``: its config is not under ``tests/apps``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.in_process import run_app
from tests.torchrun_utils import REPO, base_env, run_command, run_python


@pytest.mark.torchrun  # the pasted rerun line is a torchrun launch
@pytest.mark.timeout(200)
def test_c39_a_plain_ddp_task_sweeps_at_world_size_one_and_its_rerun_line_runs_it(tmp_path):
    """Two trials in the sweeper's one-process gloo group, each training a DDP model; then the rerun line the
    sweep writes runs the same DDP task outside the sweep (found by a new-user trial: a ``python app.py`` line
    failed in the task's guarded ``init_process_group`` with "RANK expected"): it launches a one-process
    torchrun world, as the sweep's trials had, and gives the same loss."""
    sweep = tmp_path / "sweep"
    run_app("ddp_plain_app", ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "hydra.sweeper.plots=false"],
            config_name="ddp_plain", env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()
    study = optuna.load_study(study_name="ddp_plain_app", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    for t in study.trials:
        record = json.loads((tmp_path / "records" / f"trial{t.number}_rank0.json").read_text())
        # The task's own group was the sweeper's one-process gloo group, and it trained a DDP model.
        assert (record["rank"], record["world_size"], record["backend"], record["in_trial"]) == (0, 1, "gloo", True)
        assert record["loss"] == pytest.approx(t.value)
    import torch.distributed as dist

    assert not dist.is_initialized()  # the sweeper's one-process group is gone with the sweep

    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    line = results["rerun_command"]
    assert " --standalone --nproc_per_node 1 " in line, line
    venv_bin = str(Path(sys.executable).parent)
    env = base_env(DSO_RECORD_DIR=str(tmp_path / "rerun"), PATH=f"{venv_bin}:{os.environ.get('PATH', '')}")
    run_command(["bash", "-c", line], timeout_s=120, cwd=REPO, env=env).check()
    (path,) = (tmp_path / "rerun").glob("trial*_rank0.json")
    record = json.loads(path.read_text())
    assert (record["rank"], record["world_size"], record["backend"]) == (0, 1, "gloo")
    assert record["loss"] == pytest.approx(results["best_value"])


@pytest.mark.torchrun
@pytest.mark.timeout(200)
def test_c39_the_ddp_example_sweeps_at_world_size_one_with_python(tmp_path):
    sweep = tmp_path / "sweep"
    run_python("examples/ddp_mlp.py", ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "epochs=1",
                                       "hydra.sweeper.plots=false"], timeout_s=150).check()
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    for t in study.trials:
        text = (sweep / str(t.number) / "ddp_mlp.log").read_text()
        assert re.search(rf"trial {t.number}: widths .* DistributedDataParallel over 1 rank\(s\)", text), text
