"""Issue 24 without torchrun: which checkpoint a retry resumes from, the retention rule on a real study, the
SIGTERM flag of a task, and the retry's record (real Optuna storage, real signals to this process)."""

from __future__ import annotations

import os
import signal
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study import _abandon, _trial_checkpoints
from hydra_plugins.ds_optuna_sweeper._study._stored import CHECKPOINT_DIR_ATTR, CONTINUES_ATTR, RESUMED_FROM_ATTR
from hydra_plugins.ds_optuna_sweeper._comm import _signals as _preempt
from hydra_plugins.ds_optuna_sweeper._task import _checkpoints
from hydra_plugins.ds_optuna_sweeper._task._handle import RankTrial


def _hf_checkpoint(directory: Path, step: int, complete: bool = True) -> Path:
    path = directory / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x")
    if complete:
        (path / "trainer_state.json").write_text("{}")
    return path


def test_newest_complete_checkpoint_is_resumed_from(tmp_path: Path) -> None:
    assert _checkpoints.latest_checkpoint(str(tmp_path / "none")) is None
    _hf_checkpoint(tmp_path, 3)
    _hf_checkpoint(tmp_path, 12)
    _hf_checkpoint(tmp_path, 15, complete=False)  # cut short by SIGKILL: no trainer_state.json
    assert _checkpoints.latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-12")
    (tmp_path / "step=20.ckpt.tmp").write_bytes(b"partial")  # a write through a temporary name, cut short
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert _checkpoints.latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-12")
    (tmp_path / "epoch=1-step=40.ckpt").write_bytes(b"lightning")
    assert _checkpoints.latest_checkpoint(str(tmp_path)) == str(tmp_path / "epoch=1-step=40.ckpt")
    time.sleep(0.01)
    (tmp_path / "last.ckpt").write_bytes(b"lightning")  # no step in the name: the newest file wins
    assert _checkpoints.latest_checkpoint(str(tmp_path)) == str(tmp_path / "last.ckpt")
    assert [_checkpoints.checkpoint_step(p) for p in ("checkpoint-7", "a/step=9.ckpt", "last.ckpt")] == [7, 9, None]
    assert _checkpoints.keep_latest(str(tmp_path), 1) == [str(tmp_path / p) for p in
                                                          ("checkpoint-3", "checkpoint-12", "epoch=1-step=40.ckpt")]
    assert _checkpoints.checkpoints(str(tmp_path)) == [str(tmp_path / "last.ckpt")]


def _study(tmp_path: Path, direction: str = "minimize") -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", direction=direction)


def _finish(study: optuna.Study, root: Path, state: TrialState, value: float | None = None, steps: int = 2) -> int:
    """Ask a trial, give it a checkpoint dir with ``steps`` checkpoints, tell it, apply the retention rule."""
    trial = study.ask()
    ckpt = _trial_checkpoints.checkpoint_of(trial, study.trials[trial.number], str(root))
    Path(ckpt.directory).mkdir(parents=True, exist_ok=True)  # as the Trainer makes its output_dir
    for step in range(1, steps + 1):
        _hf_checkpoint(Path(ckpt.directory), step)
    study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)
    _trial_checkpoints.retain(study, trial.number, keep_best=1, keep_pruned=False, retried=False)
    return trial.number


def test_retention_keeps_the_best_trials_newest_checkpoint_only(tmp_path: Path) -> None:
    study, root = _study(tmp_path), tmp_path / "checkpoints"
    a = _finish(study, root, TrialState.COMPLETE, 0.5)
    assert _checkpoints.checkpoints(str(root / f"trial{a}")) == [str(root / f"trial{a}" / "checkpoint-2")]
    pruned = _finish(study, root, TrialState.PRUNED)
    failed = _finish(study, root, TrialState.FAIL)
    b = _finish(study, root, TrialState.COMPLETE, 0.2)  # better (minimize): a drops out of the best 1
    c = _finish(study, root, TrialState.COMPLETE, 0.9)  # worse: goes at once
    assert sorted(p.name for p in root.iterdir()) == [f"trial{b}"]
    assert not any((root / f"trial{n}").exists() for n in (a, pruned, failed, c))
    live = study.ask()  # a running trial's checkpoints are never touched
    _hf_checkpoint(Path(_trial_checkpoints.checkpoint_of(live, study.trials[live.number], str(root)).directory), 1)
    _finish(study, root, TrialState.COMPLETE, 0.95)
    assert (root / f"trial{live.number}" / "checkpoint-1").exists()


def test_retention_logs_only_directories_that_held_a_checkpoint(tmp_path: Path, caplog) -> None:
    """A task that never saves still gets an (empty) directory per trial; deleting it is no news, so the
    retention rule's log line names only directories that held a file (new-user report: one line per trial)."""
    study, root = _study(tmp_path), tmp_path / "checkpoints"
    with caplog.at_level("INFO", logger=_trial_checkpoints.__name__):
        empty = _finish(study, root, TrialState.PRUNED, steps=0)
        assert not (root / f"trial{empty}").exists()
        assert "retention rule" not in caplog.text
        saved = _finish(study, root, TrialState.PRUNED, steps=1)
        best = _finish(study, root, TrialState.COMPLETE, 0.1, steps=0)  # the best trial, with nothing saved
        assert not (root / f"trial{best}").exists()  # no empty directory kept for it (new-user report)
    lines = [r.getMessage() for r in caplog.records if "retention rule" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith(str(root / f"trial{saved}")), lines


def test_a_retry_keeps_the_checkpoint_dir_and_the_curve_and_says_what_it_continues(tmp_path: Path) -> None:
    study, root = _study(tmp_path), tmp_path / "checkpoints"
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    first = _trial_checkpoints.checkpoint_of(trial, study.trials[trial.number], str(root))
    assert first.directory == str(root / f"trial{trial.number}") and first.resume_from is None and first.continues is None
    trial.report(0.7, 250)
    trial.report(0.6, 500)
    saved = _hf_checkpoint(Path(first.directory), 4)
    study.tell(trial, state=TrialState.FAIL)
    retry_number = _abandon.requeue_interrupted(study, trial.number)
    retry = study.ask()
    assert retry.number == retry_number and retry.params == trial.params
    again = _trial_checkpoints.checkpoint_of(retry, study.trials[retry.number], str(tmp_path / "elsewhere"))  # another sweep dir: same dir
    assert again == _trial_checkpoints.TrialCheckpoint(first.directory, str(saved), trial.number, (250, 500), trial.number)
    stored = study.trials[retry.number]
    assert stored.user_attrs[CHECKPOINT_DIR_ATTR] == first.directory
    assert stored.user_attrs[CONTINUES_ATTR] == trial.number and stored.user_attrs[RESUMED_FROM_ATTR] == str(saved)
    assert stored.intermediate_values == {250: 0.7, 500: 0.6}


@pytest.fixture
def clean_preempt():
    _preempt._reset_for_tests()
    yield
    _preempt._reset_for_tests()


def test_sigterm_in_a_task_sets_the_flag_only_once_the_task_checks_it(clean_preempt) -> None:
    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with _preempt.task_window():  # not aware: SIGTERM goes to the handler that was there (rank 0's guard)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert seen == [signal.SIGTERM] and not _preempt.received()
        study = optuna.create_study()
        trial = RankTrial(0, {}, optuna_trial=study.ask(), checkpoint_dir="/tmp/x")
        with _preempt.task_window():
            assert trial.should_preempt() is False  # the first check makes the process aware
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert trial.should_preempt() is True and trial.preempted
        assert seen == [signal.SIGTERM]  # the earlier handler did not run: the flag took the signal
        assert signal.getsignal(signal.SIGTERM) is not _preempt._on_signal  # put back after the task
    finally:
        signal.signal(signal.SIGTERM, before)


def test_ctrl_c_in_a_task_that_checks_sets_the_same_flag_once_and_before_it_raises_keyboardinterrupt(clean_preempt) -> None:
    """Issue 40: SIGINT sets the flag SIGTERM sets, in a task that checks ``should_preempt()``; Ctrl-C reaches a
    rank twice (the terminal, then torchrun's agent passing it on): the flag keeps the first; before the task
    checks, Ctrl-C is Python's ``KeyboardInterrupt`` as before."""
    study = optuna.create_study()
    with _preempt.task_window():  # not aware yet
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert _preempt.received() is None
    trial = RankTrial(0, {}, optuna_trial=study.ask(), checkpoint_dir="/tmp/x")
    with _preempt.task_window():
        assert trial.should_preempt() is False
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # torchrun's agent passes the terminal's Ctrl-C on
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert _preempt.received() == signal.SIGINT  # the first signal, once
        assert trial.should_preempt() is True
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back after the task


def test_a_report_at_an_inherited_step_is_skipped() -> None:
    study = optuna.create_study()
    asked = study.ask()
    asked.report(0.5, 250)
    trial = RankTrial(asked.number, {}, optuna_trial=asked, inherited_steps=(250,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trial.report(0.9, 250)  # the retried attempt's value stays; Optuna's "already reported" warning is not raised
    trial.report(0.4, 500)
    assert study.trials[0].intermediate_values == {250: 0.5, 500: 0.4}



def test_a_task_that_does_not_stop_within_the_grace_gets_sigterms_old_action(clean_preempt) -> None:
    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        _preempt.mark_aware()
        with _preempt.task_window(grace_s=0.2):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert _preempt.received() and seen == []  # the flag took it
            time.sleep(2)  # stuck where it never checks: the alarm wakes this sleep after 0.2 s
            assert seen == [signal.SIGTERM]  # rank 0's guard would raise Preempted here
        with _preempt.task_window(grace_s=0.2), pytest.raises(KeyboardInterrupt):  # Ctrl-C: Python's own, late
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert _preempt.received() == signal.SIGINT
            time.sleep(2)
        with _preempt.task_window(grace_s=0.2):  # acknowledged in time: nothing more happens
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            _preempt.acknowledge()
            time.sleep(0.4)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)
