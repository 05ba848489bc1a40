"""The training glue under real torchrun (2 ranks, CPU, gloo), without the sweeper.

``tests/apps/trial_loop.py`` runs several trials of ``examples/train.py`` back to back in one torchrun world,
as a sweep would; each rank writes what its DeepSpeed engine really used (``DSO_RECORD_DIR``). Cases from
CASES.md: C02, C03, C04, C14. Each run uses a tiny data slice (64 train / 32 eval questions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.torchrun_utils import TorchrunResult, run_python, run_torchrun

pytestmark = pytest.mark.torchrun

LOOP = "tests/apps/trial_loop.py"
NPROC = 2
TINY = ["data.train_size=64", "data.eval_size=32", "training.warmup_steps=0"]


def run_trials(record_dir: Path, trials: list[list[str]], *, timeout_s: float) -> TorchrunResult:
    """Run ``trials`` (override lists) in one torchrun world; every rank records each trial."""
    return run_torchrun(LOOP, [json.dumps(trials)], nproc=NPROC, timeout_s=timeout_s,
                        extra_env={"DSO_RECORD_DIR": str(record_dir)})


def read_records(record_dir: Path, n_trials: int) -> list[list[dict[str, Any]]]:
    """``records[trial][rank]``; fails if a rank did not write one."""
    return [[json.loads((record_dir / f"trial{t}_rank{r}.json").read_text()) for r in range(NPROC)]
            for t in range(n_trials)]


def strings_in(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return [value] if isinstance(value, str) else []


# Trials that differ in ZeRO stage, accumulation, micro batch, lr and seed (C02, C03, C04); the last one
# sees the same samples per update as the first, without accumulation.
GLUE_TRIALS = [
    {"stage": 1, "ga": 4, "micro": 2, "lr": 3e-4, "seed": 1},
    {"stage": 2, "ga": 1, "micro": 4, "lr": 1e-4, "seed": 2},
    {"stage": 2, "ga": 2, "micro": 2, "lr": 5e-5, "seed": 1},
    {"stage": 1, "ga": 1, "micro": 8, "lr": 3e-4, "seed": 1},
]


@pytest.fixture(scope="module")
def glue(tmp_path_factory) -> list[list[dict[str, Any]]]:
    record_dir = tmp_path_factory.mktemp("glue")
    trials = [TINY + [f"deepspeed=zero{t['stage']}", f"training.gradient_accumulation_steps={t['ga']}",
                      f"training.per_device_train_batch_size={t['micro']}", f"training.learning_rate={t['lr']}",
                      f"training.seed={t['seed']}"] for t in GLUE_TRIALS]
    run_trials(record_dir, trials, timeout_s=150).check()
    return read_records(record_dir, len(trials))


@pytest.mark.timeout(200)
def test_c02_engine_batch_settings_equal_the_trials_on_every_rank(glue):
    for number, (trial, per_rank) in enumerate(zip(GLUE_TRIALS, glue)):
        for rec in per_rank:
            where = f"trial {number} rank {rec['rank']}"
            assert rec["world_size"] == NPROC, where
            assert rec["engine_gradient_accumulation_steps"] == trial["ga"], where
            assert rec["engine_train_micro_batch_size_per_gpu"] == trial["micro"], where
            assert rec["engine_train_batch_size"] == trial["micro"] * trial["ga"] * NPROC, where
            # 64 questions split over the ranks, one training_step per micro batch, one update per ga of them.
            assert rec["training_step_calls"] == 64 // NPROC // trial["micro"], where
            assert rec["global_step"] == rec["training_step_calls"] // trial["ga"], where


@pytest.mark.timeout(200)
def test_c03_second_trial_gets_its_own_lr_micro_batch_and_stage(glue):
    for number, (trial, per_rank) in enumerate(zip(GLUE_TRIALS, glue)):
        for rec in per_rank:
            where = f"trial {number} rank {rec['rank']}"
            assert rec["engine_zero_stage"] == trial["stage"], where
            assert rec["optimizer_lr_start"] == pytest.approx(trial["lr"]), where  # warmup 0: lr from step 1
            assert rec["engine_config"]["optimizer"]["params"]["lr"] == pytest.approx(trial["lr"]), where
            assert rec["engine_config"]["train_micro_batch_size_per_gpu"] == trial["micro"], where
            assert "auto" not in [s.lower() for s in strings_in(rec["engine_config"])], where
    # The 1 -> 2 transition of C03: stage 1 then 2, and every value of trial 2 differs from trial 1's.
    assert GLUE_TRIALS[0]["stage"] == 1 and GLUE_TRIALS[1]["stage"] == 2


@pytest.mark.timeout(200)
def test_c04_initial_weights_depend_only_on_the_seed(glue):
    checksums = [{rec["initial_weights_sha256"] for rec in per_rank} for per_rank in glue]
    assert all(len(c) == 1 for c in checksums), f"ranks disagree: {checksums}"
    by_trial = [c.pop() for c in checksums]
    assert GLUE_TRIALS[0]["seed"] == GLUE_TRIALS[2]["seed"] == GLUE_TRIALS[3]["seed"] != GLUE_TRIALS[1]["seed"]
    assert by_trial[0] == by_trial[2] == by_trial[3], "same seed, different initial weights"
    assert by_trial[0] != by_trial[1], "different seeds, same initial weights"


@pytest.mark.timeout(200)
def test_objective_is_the_same_on_every_rank_and_covers_the_whole_eval_slice(glue):
    for number, per_rank in enumerate(glue):
        assert len({rec["eval_accuracy"] for rec in per_rank}) == 1, f"trial {number}"
        assert all(rec["eval_examples"] == 32 for rec in per_rank), f"trial {number}"
        assert all(len(rec["eval_history"]) >= 4 for rec in per_rank), f"trial {number}: evaluations"
        assert all(rec["eval_history"][-1][0] == rec["global_step"] for rec in per_rank), f"trial {number}"


@pytest.mark.timeout(200)
def test_training_loss_does_not_scale_with_gradient_accumulation(glue):
    """Accumulation 4 x micro batch 2 and 1 x 8 see the same samples per update from the same weights.

    Without ``loss_is_scaled_for_ga = False`` in the example's Trainer the first trial's loss (and gradients)
    came out 4 times larger (transformers 5.24 takes BERT's plain mean loss as normalised by
    ``num_items_in_batch``). The eval accuracies are not compared: after 4 Adam updates on 64 questions they
    differed by up to 3 of 32 eval questions from padding and summation-order noise alone.
    """
    accumulated, plain = glue[0], glue[3]
    assert (GLUE_TRIALS[0]["ga"] * GLUE_TRIALS[0]["micro"]) == (GLUE_TRIALS[3]["ga"] * GLUE_TRIALS[3]["micro"])
    for a, p in zip(accumulated, plain):
        assert a["train_loss"] == pytest.approx(p["train_loss"], rel=0.02), (a["train_loss"], p["train_loss"])


@pytest.mark.timeout(200)
def test_c14_five_trials_leave_no_engine_and_flat_memory(tmp_path):
    """Five trials, ZeRO stages 3, 1, 2, 3, 1: no engine survives a trial; RSS after trial 5 within 5% of trial 1.

    ZeRO-3 comes first on purpose. The first ZeRO-3 trial of a process raises RSS once by 25-40 MiB (5-8% of
    ~510 MiB) and it stays flat afterwards, also across later ZeRO-3 trials; glibc's ``mallinfo2`` showed the
    bytes in use flat and only the free bytes inside the heap grown (fragmentation, not a leak). With
    ZeRO-3 first that one-time step is in the baseline, and the check still catches a leak per trial (about
    +95 MiB, or 19%, per trial without the teardown).
    """
    stages = [3, 1, 2, 3, 1]
    record_dir = tmp_path / "records"
    run_trials(record_dir, [TINY + [f"deepspeed=zero{s}"] for s in stages], timeout_s=170).check()
    records = read_records(record_dir, len(stages))
    for number, per_rank in enumerate(records):
        for rec in per_rank:
            assert rec["engine_zero_stage"] == stages[number]
            assert rec["live_engines_after_teardown"] == 0, f"trial {number} rank {rec['rank']}"
    for rank in range(NPROC):
        rss = [records[t][rank]["rss_mib_after_teardown"] for t in range(len(stages))]
        assert abs(rss[-1] / rss[0] - 1) <= 0.05, f"rank {rank}: RSS after each trial (MiB) {rss}"


@pytest.mark.timeout(150)
def test_zero3_two_trials_exit_zero_on_every_rank(tmp_path):
    """A fresh process whose first trial is ZeRO-3 (partitioned init before the engine exists), twice."""
    record_dir = tmp_path / "records"
    res = run_trials(record_dir, [TINY + ["deepspeed=zero3", f"training.seed={s}"] for s in (1, 2)], timeout_s=120)
    res.check()
    assert "terminate called" not in res.output
    records = read_records(record_dir, 2)
    assert all(rec["engine_zero_stage"] == 3 and rec["live_engines_after_teardown"] == 0
               for per_rank in records for rec in per_rank)


@pytest.mark.timeout(150)
def test_example_app_runs_once_under_torchrun_without_multirun(tmp_path):
    res = run_torchrun("examples/train.py", [*TINY, f"hydra.run.dir={tmp_path / 'run'}"], nproc=NPROC,
                       timeout_s=120, extra_env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()
    assert res.output.count("eval_accuracy=") == 1  # printed by rank 0 only
    records = read_records(tmp_path / "records", 1)[0]
    assert [rec["world_size"] for rec in records] == [NPROC] * NPROC
    assert records[0]["engine_zero_stage"] == 2  # the default


@pytest.mark.timeout(150)
def test_example_app_runs_once_with_plain_python(tmp_path):
    res = run_python("examples/train.py", [*TINY, f"hydra.run.dir={tmp_path / 'run'}"], timeout_s=120,
                     extra_env={"DSO_RECORD_DIR": str(tmp_path / "records")}).check()
    accuracy = float(res.output.split("eval_accuracy=")[1].split()[0])
    record = json.loads((tmp_path / "records" / "trial0_rank0.json").read_text())
    assert record["world_size"] == 1 and record["engine_train_batch_size"] == 8
    assert record["eval_accuracy"] == pytest.approx(accuracy, abs=1e-4)
