"""The main job's refit (``examples/train.py -m`` with ``hydra.sweeper.refit``): search trials never see the
held-out test rows, and ``data.stage=final`` trains on train + eval and scores the test rows.

Two ranks on CPU/gloo with DeepSpeed ZeRO-2 and a tiny slice (64 train / 32 eval questions, 40 test rows
scored): one enqueued trial, then its refit. Each rank writes a record per run (``DSO_RECORD_DIR``, see
``examples/train.py``) holding the questions of every dataset it built; the test splits the data itself
(``load_trec6``) and checks them against the held-out test part.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from tests.torchrun_utils import REPO, run_torchrun

sys.path.insert(0, str(REPO / "examples"))

pytestmark = pytest.mark.torchrun

NPROC = 2
TINY = ["data.train_size=64", "data.eval_size=32", "data.test_size=40", "training.eval_steps=0.5",
        "training.logging_steps=0.5"]


def _splits() -> dict[str, set[str]]:
    import train  # examples/train.py

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[o for o in TINY if o.startswith("data.")])
    return {name: {q for q, _ in pairs} for name, pairs in train.load_trec6(cfg.data).items()}


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

    splits = _splits()
    for rank in range(NPROC):
        search = json.loads((records / f"trial0_rank{rank}.json").read_text())
        used = {name: set(qs) for name, qs in search["questions"].items()}
        assert search["stage"] == "search" and search["split_sizes"] == {"train": 64, "eval": 32}, search["split_sizes"]
        test_rows_touched = sum(len(qs & splits["test"]) for qs in used.values())
        assert test_rows_touched == 0, f"rank {rank}: a search trial tokenised {test_rows_touched} test questions"
        assert used == {"train": splits["train"], "eval": splits["eval"]}

        final = json.loads((records / f"final0_rank{rank}.json").read_text())
        used = {name: set(qs) for name, qs in final["questions"].items()}
        assert final["stage"] == "final" and final["split_sizes"] == {"train": 96, "test": 40}, final["split_sizes"]
        assert used["train"] == splits["train"] | splits["eval"]
        assert used["test"] <= splits["test"] and not used["test"] & used["train"]

    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    (refit,) = results["refit"]
    assert refit["trial"] == 0 and refit["state"] == "COMPLETE", refit
    assert refit["overrides"][-1] == "data.stage=final"
    metrics = refit["metrics"]
    assert metrics["test_examples"] == 40 and metrics["train_examples"] == 96, metrics
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and 0.0 <= metrics["test_macro_f1"] <= 1.0, metrics
    assert Path(refit["job_dir"]) == sweep / "refit" / "0"
