"""Trial groups (``hydra.sweeper.n_jobs``, issue 23) under the real training code: the main job (HF Trainer +
DeepSpeed ZeRO-2), the plain DDP example and the Lightning example, each swept by 4 ranks with ``n_jobs=2``.

Every test runs the example itself (through ``tests/apps/recorded_example.py``, which only records each rank's
exit status) with ``n_trials=2``: the fewest trials that show two 2-rank trials at once, one per group. Each
rank writes what its training code saw (``DSO_RECORD_DIR``: the examples' own records, with the trial's span
``start``/``end`` and a fingerprint of the resolved config), and the tests read them next to the study.
Asserts, for each app: the study holds exactly the 2 trials, both COMPLETE (so the config check passed), one
in each group; both ranks of a trial recorded the same resolved config and a world of 2, as the training code
sees it; the two trials' spans overlap; every rank's own process exits 0.

All three run under ``make soak`` (issue 39: a launch per cross-rank contract in ``make test``): a trial group's
world (its own default process group of 2, which DeepSpeed, DDP and Lightning read) is the 4-rank contract launch
of ``tests/multirank/test_trial_groups.py``; the main job under DeepSpeed ``tests/multirank/test_main_job_sweep.py``
and ``test_training_glue.py``; Lightning under the sweeper ``tests/multirank/test_lightning.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import exit_env, exit_lines, exit_statuses
from tests.torchrun_utils import TRAINING_ENV, TorchrunResult, run_torchrun

pytestmark = pytest.mark.torchrun

APP = "tests/apps/recorded_example.py"
NPROC, N_JOBS, N_TRIALS = 4, 2, 2
GROUP_SIZE = NPROC // N_JOBS
GROUP = "ds_optuna:trial_group"
# The main-job tests' smallest slice (tests/multirank/test_training_glue.py): 64 train / 32 eval questions.
TINY = ["data.train_size=64", "data.eval_size=32", "training.warmup_steps=0"]


def sweep(tmp_path: Path, example: str, *overrides: str, timeout_s: float = 150) -> TorchrunResult:
    """``torchrun --nproc-per-node 4 <example> -m hydra.sweeper.n_jobs=2 hydra.sweeper.n_trials=2 ...``.

    ``rank_timeout=60``: 4 ranks of DeepSpeed or Lightning on 2 shared cores ran up to 3 times slower than alone
    (load average 10); still below the run's own timeout, so a hang fails as the sweeper's error first.
    """
    (tmp_path / "records").mkdir()
    args = [example, "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.sweeper.n_jobs={N_JOBS}",
            f"hydra.sweeper.n_trials={N_TRIALS}", "hydra.sweeper.rank_timeout=60", "hydra.sweeper.plots=false",
            *overrides]
    return run_torchrun(APP, args, nproc=NPROC, timeout_s=timeout_s,
                        extra_env={"DSO_RECORD_DIR": str(tmp_path / "records"), **exit_env(tmp_path), **TRAINING_ENV})


def check_trial_groups(tmp_path: Path, study_name: str, res: TorchrunResult) -> tuple[list[Any], dict]:
    """The assertions every app shares (see the module docstring); returns the study's trials and the
    records ``{(trial number, rank in its group): record}``."""
    res.check()
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{tmp_path / 'sweep'}/optuna.db")
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * N_TRIALS, [t.state for t in trials]
    groups = {t.number: t.user_attrs.get(GROUP) for t in trials}
    assert set(groups.values()) == set(range(N_JOBS)), groups  # 2 trials, 2 groups: one trial on each
    records = {}
    for path in (tmp_path / "records").glob("trial*_rank*.json"):
        rec = json.loads(path.read_text())
        records[rec["trial_number"], rec["rank"]] = rec
    assert sorted(records) == [(t.number, r) for t in trials for r in range(GROUP_SIZE)], sorted(records)
    spans = {}
    for t in trials:
        pair = [records[t.number, r] for r in range(GROUP_SIZE)]
        where = f"trial {t.number} (group {groups[t.number]})"
        assert [rec["world_size"] for rec in pair] == [GROUP_SIZE] * GROUP_SIZE, where
        assert len({rec["config_sha256"] for rec in pair}) == 1, f"{where}: the ranks resolved different configs"
        spans[t.number] = (max(rec["start"] for rec in pair), min(rec["end"] for rec in pair))  # both ranks in it
    (s0, e0), (s1, e1) = spans.values()
    assert max(s0, s1) < min(e0, e1), f"the two trials did not run at once: spans {spans} (time.time())"
    assert exit_statuses(tmp_path) == {r: 0 for r in range(NPROC)}, exit_lines(tmp_path)
    return trials, records


@pytest.mark.soak
@pytest.mark.timeout(200)
def test_main_job_two_2rank_deepspeed_trials_at_once(tmp_path):
    """``examples/train.py`` (HF Trainer + DeepSpeed ZeRO-2) with gradient accumulation 1 in one trial and 2 in
    the other: each engine sees a world of 2 and ``train_batch_size == micro * accumulation * 2``."""
    space = "{training.gradient_accumulation_steps:'choice(1,2)'}"
    enqueued = "[{training.gradient_accumulation_steps:1},{training.gradient_accumulation_steps:2}]"
    res = sweep(tmp_path, "examples/train.py", "~hydra.sweeper.params", f"+hydra.sweeper.params={space}",
                f"hydra.sweeper.enqueue_trials={enqueued}", "deepspeed=zero2", *TINY)
    trials, records = check_trial_groups(tmp_path, "train", res)
    assert sorted(t.params["training.gradient_accumulation_steps"] for t in trials) == [1, 2]
    for t in trials:
        ga = t.params["training.gradient_accumulation_steps"]
        for rank in range(GROUP_SIZE):
            rec, where = records[t.number, rank], f"trial {t.number} rank {rank}"
            assert rec["engine_zero_stage"] == 2, where
            assert rec["engine_world_size"] == GROUP_SIZE, where
            assert rec["engine_gradient_accumulation_steps"] == ga, where
            micro = rec["engine_train_micro_batch_size_per_gpu"]
            assert rec["engine_train_batch_size"] == micro * ga * GROUP_SIZE, (where, rec["engine_train_batch_size"])
            assert rec["live_engines_after_teardown"] == 0, where


@pytest.mark.soak  # make test: the 4-rank contract launch (test_trial_groups.py) and the Lightning launch
@pytest.mark.timeout(150)
@pytest.mark.parametrize("example, study_name, epochs", [
    ("examples/ddp_mlp.py", "ddp_mlp", 2),  # a trial's span holds the data and DDP set-up too: seconds
    ("examples/lightning_mlp.py", "lightning_mlp", 8),  # the span is the fit only (0.2 s an epoch here)
])
def test_ddp_and_lightning_two_2rank_trials_at_once(tmp_path, example, study_name, epochs):
    """The plain DDP example (``dist.get_world_size()``) and the Lightning example (``trainer.world_size``):
    both ranks of each trial train in a world of 2 with the same params, the two trials at once."""
    res = sweep(tmp_path, example, f"epochs={epochs}", timeout_s=110)
    trials, records = check_trial_groups(tmp_path, study_name, res)
    for t in trials:
        assert [records[t.number, r]["params"] for r in range(GROUP_SIZE)] == [t.params] * GROUP_SIZE
