"""Run the test app under real torchrun and read back what each rank recorded and what was stored."""

import json
import os
import shutil
import sys
from pathlib import Path

import optuna

from tests.torchrun_utils import TorchrunResult, base_env, run_command, run_python, run_torchrun

APP = "tests/apps/sweep_app.py"
#: ``env`` for runs whose ranks' own exit statuses are asserted: a rank whose process ended non-zero
#: stays in torchrun's world 5 s after writing its status (``tests/apps/exit_record.py``), so torchrun
#: does not stop the others before they write theirs. Pair it with ``hydra.sweeper.plots=false``:
#: rank 0 then leaves within that time.
LINGER = {"DSO_EXIT_LINGER_S": "5"}


def run_sweep(tmp_path: Path, *overrides: str, nproc: int = 2, timeout_s: float = 150, env=None,
              torchrun_args=None, plots_off: bool = True) -> TorchrunResult:
    """``torchrun --nproc-per-node nproc sweep_app.py -m ...`` (``nproc=1``: plain python, no torchrun).

    The sweep dir is ``tmp_path/sweep``, each rank's records go to ``tmp_path/records`` and each
    rank's exit status to ``tmp_path/exits`` (emptied first: :func:`exit_statuses` reads this run's).
    ``timeout_s`` is capped by the test's deadline (``tests/torchrun_utils.py``).

    ``plots_off`` (the default) adds ``hydra.sweeper.plots=false`` unless an override sets
    ``hydra.sweeper.plots``: rank 0's plots cost about 3 s of CPU at the end of every run and never fail
    a sweep (``_study/_plots.py``), so only the tests of the plots themselves write them
    (``test_settings_coverage.py``, ``test_results.py``: ``plots_off=False``, the app's default, plots on).
    """
    if plots_off and not any(o.lstrip("+~").split("=")[0] == "hydra.sweeper.plots" for o in overrides):
        overrides = ("hydra.sweeper.plots=false", *overrides)
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30", *overrides]
    extra = {"DSO_RECORD_DIR": str(tmp_path / "records"), **exit_env(tmp_path), **(env or {})}
    if nproc == 1:
        return run_python(APP, args, timeout_s=timeout_s, extra_env=extra)
    return run_torchrun(APP, args, nproc=nproc, timeout_s=timeout_s, extra_env=extra, torchrun_args=torchrun_args)


def load(tmp_path: Path, study_name: str = "sweep_app", sweep_dir: Path | None = None) -> optuna.Study:
    storage = f"sqlite:///{sweep_dir or tmp_path / 'sweep'}/optuna.db"
    return optuna.load_study(study_name=study_name, storage=storage)


def create_study(tmp_path: Path, direction: str = "minimize", study_name: str = "sweep_app") -> optuna.Study:
    """Create the (empty) study the app's next sweep in ``tmp_path`` resumes, from this process.

    Tests that measure ``rank_timeout`` with a small value use it, so that the SQLite schema creation
    (seconds on a loaded machine, while the other ranks wait under ``rank_timeout``) is done before
    the ranks start.
    """
    (tmp_path / "sweep").mkdir(parents=True, exist_ok=True)
    return optuna.create_study(study_name=study_name, storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db",
                               direction=direction)


def records(tmp_path: Path) -> dict[tuple[int, int], dict]:
    """``{(trial number, rank): record}`` written by the app on each rank."""
    out = {}
    for f in sorted((tmp_path / "records").glob("trial*_rank*.json")):
        r = json.loads(f.read_text())
        out[(r["job_num"], r["rank"])] = r
    return out


def exit_env(tmp_path: Path) -> dict[str, str]:
    """``{"DSO_EXIT_DIR": tmp_path/exits}`` for a run of a test app, the folder emptied first, so that
    :func:`exit_lines` and :func:`exit_statuses` read that run's lines only."""
    exits = tmp_path / "exits"
    shutil.rmtree(exits, ignore_errors=True)
    return {"DSO_EXIT_DIR": str(exits)}


def exit_lines(tmp_path: Path) -> dict[int, list[dict]]:
    """``{rank: [{"rank", "restart", "status", "signal", "pid"}, ...]}`` of the last run in ``tmp_path``
    started with :func:`exit_env` (every :func:`run_sweep`), one line per process of that rank in start
    order (torchrun restarts add lines). ``status`` is observed (``tests/apps/exit_record.py``): the exit
    code, or minus the signal that killed the process."""
    return jsonl_by(tmp_path / "exits", "exit_rank*.jsonl", "rank")


def jsonl_by(folder: Path, pattern: str, key: str) -> dict:
    """``{record[key]: [records]}`` of every JSON line of the files ``folder/pattern``, files in name order."""
    out: dict = {}
    for f in sorted(folder.glob(pattern)):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            out.setdefault(r[key], []).append(r)
    return out


def exit_statuses(tmp_path: Path, restart: int = 0) -> dict[int, int]:
    """``{rank: observed exit status}`` of each rank's process of torchrun attempt ``restart`` (negative:
    killed by that signal); a rank with no line is absent (its recording parent was SIGKILLed first)."""
    return {rank: line["status"] for rank, lines in exit_lines(tmp_path).items() for line in lines
            if line["restart"] == restart}


def paste_rerun_line(tmp_path: Path, line: str, stage: str = "search") -> float:
    """Run a results file's ``rerun_command`` with bash, as a user pastes it (this environment's bin dir
    first on PATH), and return the value ``tests/apps/rerun_app.py`` recorded for ``stage``."""
    assert "\n" not in line
    env = base_env(DSO_RECORD_DIR=str(tmp_path / "rec"), PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    run_command(["bash", "-c", line], timeout_s=150, cwd=tmp_path, env=env).check()
    return json.loads((tmp_path / "rec" / f"value_single_{stage}_run.json").read_text())["value"]
