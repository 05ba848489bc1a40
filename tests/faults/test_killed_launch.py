"""Case C54 (optuna/optuna#5138, #6283): a launch killed with SIGKILL mid-trial leaves its trial RUNNING;
the same command run again at once must close it as the README's crash row says (FAIL, re-queued with
``retry_failed_trials``, and say which), on the journal file (which has no heartbeat at all) and on the
default SQLite (whose heartbeat grace had not passed).

Real torchrun on CPU: SIGKILL goes to torchrun's process group and every rank (``kill_tree``), as a job
scheduler or the OOM killer would do it; nothing of the launch runs any code after it. The same command run again
is run in process (``tests/in_process.py``): what it does with the trial the killed launch left RUNNING is rank
0's alone (``_owners.close_orphans``, whose rules are tested in ``tests/test_owners.py``). The journal-file case
repeats the same with one rank on another storage: a soak test (``make soak``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.in_process import run_app
from tests.torchrun_utils import base_env, kill_tree, run_torchrun, start_process, torchrun_command

pytestmark = [pytest.mark.torchrun]

APP = "tests/apps/sweep_app.py"


def _args(tmp_path: Path, storage: str | None) -> list[str]:
    return [
        "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.n_trials=3", "hydra.sweeper.rank_timeout=30",
        "hydra.sweeper.plots=false", "hydra.sweeper.retry_failed_trials=1", "x=interval(-1,1)", "sleep_s=2",
        *([f"hydra.sweeper.storage={storage}"] if storage else []),
    ]


def _kill_in_trial(tmp_path: Path, args: list[str], nproc: int, trial: int, timeout_s: float = 90) -> None:
    """Start the sweep and SIGKILL torchrun and all its ranks once every rank has started ``trial``."""
    records = tmp_path / "records"
    log = tmp_path / "killed.log"
    with open(log, "w") as f:
        proc = start_process(torchrun_command(APP, args, nproc=nproc), cwd=tmp_path,
                             env=base_env(DSO_RECORD_DIR=str(records)), stdout=f)
    deadline = time.monotonic() + timeout_s
    try:
        while not all((records / f"trial{trial}_rank{r}.json").exists() for r in range(nproc)):
            assert proc.poll() is None, f"the sweep ended before trial {trial}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"trial {trial} did not start in {timeout_s} s:\n{log.read_text()[-4000:]}"
            time.sleep(0.1)
    finally:
        kill_tree(proc)
    assert proc.returncode == -9, proc.returncode


def _check_closed_and_rerun(study: optuna.Study, output: str, killed: int) -> None:
    trials = study.get_trials(deepcopy=False)
    assert TrialState.RUNNING not in [t.state for t in trials], [(t.number, t.state.name) for t in trials]
    assert trials[killed].state == TrialState.FAIL
    retries = [t for t in trials if killed in t.system_attrs.get("retry_history", ())]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE, [(t.number, t.state.name) for t in trials]
    assert retries[0].params == trials[killed].params  # re-queued with its params, and run
    assert re.search(rf"trial {killed} was RUNNING with no live owner \(launch \S+\): closed FAIL and re-queued as "
                     rf"trial {retries[0].number} with the same params", output), output[-5000:]


@pytest.mark.soak
@pytest.mark.timeout(240)
def test_c54_journal_file_one_rank_sigkilled_then_the_same_command(tmp_path):
    journal = tmp_path / "journal.log"
    storage = ("{_target_:optuna.storages.JournalStorage,log_storage:"
               f"{{_target_:optuna.storages.journal.JournalFileBackend,file_path:'{journal}'}}}}")
    args = _args(tmp_path, storage)
    _kill_in_trial(tmp_path, args, nproc=1, trial=1)
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    study = optuna.load_study(study_name="sweep_app", storage=optuna.storages.JournalStorage(backend))
    assert [t.state for t in study.trials][:2] == [TrialState.COMPLETE, TrialState.RUNNING]

    res = run_torchrun(APP, args, nproc=1, timeout_s=120, cwd=tmp_path,
                       extra_env={"DSO_RECORD_DIR": str(tmp_path / "records2")})
    res.check()
    study = optuna.load_study(study_name="sweep_app", storage=optuna.storages.JournalStorage(backend))
    _check_closed_and_rerun(study, res.output, killed=1)


@pytest.mark.timeout(240)
def test_c54_default_sqlite_two_ranks_sigkilled_then_the_same_command_at_once(tmp_path):
    args = _args(tmp_path, None)
    _kill_in_trial(tmp_path, args, nproc=2, trial=1)
    storage = f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}"
    assert [t.state for t in optuna.load_study(study_name="sweep_app", storage=storage).trials][:2] == [
        TrialState.COMPLETE, TrialState.RUNNING]

    # The same command, at once (in process: world size 1 is all that rank 0's closing needs).
    res = run_app("sweep_app", args[:], config_name="app", cwd=tmp_path,
                  env={"DSO_RECORD_DIR": str(tmp_path / "records2")}).check()
    _check_closed_and_rerun(optuna.load_study(study_name="sweep_app", storage=storage), res.output, killed=1)
