"""A sweep of the main job (``examples/train.py -m``: HF Trainer + DeepSpeed ZeRO-2) under real torchrun.

Two ranks on CPU/gloo, a tiny data slice (128 train / 64 eval questions, 8 optimizer steps per trial, an
evaluation every 2 steps) and the median pruner. The trials are fixed by ``enqueue_trials`` so that the
PRUNED outcome follows from the pruner's rule, not from luck:

- trial 0: ``learning_rate=3e-4``. The first trial always completes (``n_startup_trials=1``).
- trials 1 and 2: ``learning_rate=0``. Nothing is updated (AdamW's step and its weight decay are both scaled
  by the lr), so every evaluation gives the accuracy of the initial weights, which are the same as trial 0's
  (same ``training.seed``). Trial 0 learns: on this slice its accuracy at step 4 was 0.34 against 0.14 for
  the untrained model (13 of 64 eval questions). The HF pruning callback reports at thousandths of an epoch
  (evaluations at global steps 2, 4, 6, 8 report 250, 500, 750, 1000). With ``n_warmup_steps=300`` the
  median pruner's first chance is step 500 (global step 4), where the trial is worse than the median of the
  completed trials (trial 0 alone), so trials 1 and 2 are pruned at global step 4, halfway through. The test
  asserts that precondition too, so a change of model, data or defaults that removes the signal fails with
  that message, not as an unexplained state.

Each rank writes one record per trial (``DSO_RECORD_DIR``, see ``examples/train.py``) with the global step it
stopped at, the step at which the pruning callback fired (``pruned_at``) and the outcome; the test reads
them next to the study in the sweep dir's ``optuna.db``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tests.torchrun_utils import run_torchrun

pytestmark = pytest.mark.torchrun

NPROC = 2
STUDY = "main_job_sweep"
GOOD_LR, BAD_LR = 3e-4, 0.0
# 128 questions / (micro batch 8 x 2 ranks) = 8 optimizer steps; evaluations at global steps 2, 4, 6, 8,
# reported at 250, 500, 750, 1000 (thousandths of an epoch, the pruning callback's default step).
STEPS_PER_TRIAL, EVAL_EVERY, WARMUP_STEPS = 8, 2, 300
REPORTED_STEPS = [250, 500, 750, 1000]
EXPECTED_PRUNE_STEP, EXPECTED_PRUNE_GLOBAL_STEP = 500, 4  # the first evaluation above n_warmup_steps
ENQUEUED = [
    {"training.learning_rate": GOOD_LR, "training.weight_decay": 0.01},
    {"training.learning_rate": BAD_LR, "training.weight_decay": 0.01},
    {"training.learning_rate": BAD_LR, "training.weight_decay": 0.0},  # no effect at lr 0: a second pruned trial
]


def _hydra_list_of_dicts(entries: list[dict[str, float]]) -> str:
    return "[" + ",".join("{" + ",".join(f"{k}:{v!r}" for k, v in e.items()) + "}" for e in entries) + "]"


def read_records(record_dir: Path, trial: int) -> list[dict[str, Any]]:
    """``[rank 0 record, rank 1 record]`` of one trial; fails naming the file when a rank wrote none."""
    out = []
    for rank in range(NPROC):
        path = record_dir / f"trial{trial}_rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no record for trial {trial} ({path})"
        out.append(json.loads(path.read_text()))
    return out


@pytest.mark.timeout(240)
def test_main_job_sweep_prunes_every_rank_at_the_same_global_step(tmp_path):
    """``examples/train.py -m`` with ZeRO-2 and the median pruner on 2 ranks.

    Asserts: the study holds exactly the 3 enqueued trials with states COMPLETE, PRUNED, PRUNED; for each
    pruned trial both ranks' pruning callbacks fired (``pruned_at`` set) at the same reported step, both ranks
    stopped training at the same global step (global step 4, before the trial's 8 steps), the reported step of the
    verdict is the last one reported to the study, and it is step 500 (the first evaluation after
    ``n_warmup_steps``); the completed
    trial ran all 8 steps on both ranks with no prune; after every trial, no DeepSpeed engine was left alive;
    every trial's ``optimizer_steps`` user attribute (stored by the HF pruning callback at the end of
    training, the basis of ``bench/pruning.py``'s "steps saved") is the global step the Trainer reached.
    """
    sweep, records = tmp_path / "sweep", tmp_path / "records"
    space = f"{{training.learning_rate:'choice({GOOD_LR},{BAD_LR})',training.weight_decay:'choice(0.01,0.0)'}}"
    args = [
        "-m",
        f"hydra.sweep.dir={sweep}",
        f"hydra.sweeper.study_name={STUDY}",
        f"hydra.sweeper.n_trials={len(ENQUEUED)}",
        "hydra.sweeper.rank_timeout=30",
        "hydra.sweeper.plots=false",
        "hydra.sweeper.sampler.seed=0",
        "hydra/sweeper/pruner=median",
        "hydra.sweeper.pruner.n_startup_trials=1",
        f"hydra.sweeper.pruner.n_warmup_steps={WARMUP_STEPS}",
        "~hydra.sweeper.params",
        f"+hydra.sweeper.params={space}",
        f"hydra.sweeper.enqueue_trials={_hydra_list_of_dicts(ENQUEUED)}",
        "deepspeed=zero2",
        "data.train_size=128",
        "data.eval_size=64",
        "training.warmup_steps=0",
        f"training.eval_steps={EVAL_EVERY}",
        f"training.logging_steps={EVAL_EVERY}",
    ]
    run_torchrun("examples/train.py", args, nproc=NPROC, timeout_s=180,
                 extra_env={"DSO_RECORD_DIR": str(records)}).check()

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{sweep}/optuna.db")
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.params for t in trials] == ENQUEUED
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]

    complete = trials[0]
    for rec in read_records(records, complete.number):
        where = f"trial {complete.number} rank {rec['rank']}"
        assert rec["outcome"] == "complete" and rec["pruned_at"] is None, where
        assert rec["global_step"] == STEPS_PER_TRIAL, where
        assert rec["live_engines_after_teardown"] == 0, where
        assert complete.user_attrs["optimizer_steps"] == rec["global_step"], (where, complete.user_attrs)
    assert sorted(complete.intermediate_values) == REPORTED_STEPS

    for trial in trials[1:]:
        per_rank = read_records(records, trial.number)
        stops = [(rec["rank"], rec["pruned_at"], rec["global_step"]) for rec in per_rank]
        assert [rec["outcome"] for rec in per_rank] == ["pruned"] * NPROC, stops
        assert all(rec["pruned_at"] is not None for rec in per_rank), f"callback did not fire on a rank: {stops}"
        assert len({rec["pruned_at"] for rec in per_rank}) == 1, f"ranks pruned at different steps: {stops}"
        assert len({rec["global_step"] for rec in per_rank}) == 1, f"ranks stopped at different steps: {stops}"
        step = per_rank[0]["pruned_at"]
        assert per_rank[0]["global_step"] == EXPECTED_PRUNE_GLOBAL_STEP < STEPS_PER_TRIAL, stops
        assert all(rec["live_engines_after_teardown"] == 0 for rec in per_rank), stops
        # The steps the pruned trial really ran (not the 8 it was set for), as the callback stored them.
        assert trial.user_attrs["optimizer_steps"] == per_rank[0]["global_step"], (trial.user_attrs, stops)
        # What the study stored: reports up to the verdict's step and none after it.
        assert max(trial.intermediate_values) == step, trial.intermediate_values
        # The precondition that makes the verdict certain: trial 0 is clearly better at that step.
        margin = complete.intermediate_values[step] - trial.intermediate_values[step]
        assert margin >= 4 / 64, f"trial 0 is not clearly better at step {step} (margin {margin}): no signal"
        assert step == EXPECTED_PRUNE_STEP, stops
