"""Run the test app under real torchrun and read back what each rank recorded and what was stored."""

import json
from pathlib import Path

import optuna

from tests.torchrun_utils import TorchrunResult, run_python, run_torchrun

APP = "tests/apps/sweep_app.py"


def run_sweep(tmp_path: Path, *overrides: str, nproc: int = 2, timeout_s: float = 150, env=None,
              torchrun_args=None) -> TorchrunResult:
    """``torchrun --nproc-per-node nproc sweep_app.py -m ...`` (``nproc=1``: plain python, no torchrun)."""
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30", *overrides]
    extra = {"DSO_RECORD_DIR": str(tmp_path / "records"), **(env or {})}
    if nproc == 1:
        return run_python(APP, args, timeout_s=timeout_s, extra_env=extra)
    return run_torchrun(APP, args, nproc=nproc, timeout_s=timeout_s, extra_env=extra, torchrun_args=torchrun_args)


def load(tmp_path: Path, study_name: str = "sweep_app", sweep_dir: Path | None = None) -> optuna.Study:
    storage = f"sqlite:///{sweep_dir or tmp_path / 'sweep'}/optuna.db"
    return optuna.load_study(study_name=study_name, storage=storage)


def records(tmp_path: Path) -> dict[tuple[int, int], dict]:
    """``{(trial number, rank): record}`` written by the app on each rank."""
    out = {}
    for f in sorted((tmp_path / "records").glob("trial*_rank*.json")):
        r = json.loads(f.read_text())
        out[(r["job_num"], r["rank"])] = r
    return out
