"""Run several trials of examples/train.py back to back in one process (one torchrun world), without a sweeper.

Usage: ``trial_loop.py '<json list of override lists>'``. Each inner list is one trial's Hydra overrides,
composed with Hydra's compose API from ``conf/train.yaml``; trial ``i`` gets job number ``i``. With
``DSO_RECORD_DIR`` set, every rank writes one record per trial (see ``examples/train.py``) and, after each
trial, a memory probe ``memory_trial<i>_rank<rank>.json`` (see ``tests/apps/memory_probe.py``). The process ends
through ``exit_cleanly`` with status 0 once every trial has run, 1 on the first error.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))

from hydra import compose, initialize_config_dir  # noqa: E402

import train  # noqa: E402  (examples/train.py)
from hydra_plugins.ds_optuna_sweeper import exit_cleanly  # noqa: E402
from memory_probe import memory_probe  # noqa: E402  (tests/apps/memory_probe.py)


def main(trials: list[list[str]]) -> None:
    record_dir = os.environ.get(train.RECORD_DIR_ENV)
    rank = int(os.environ.get("RANK", 0))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"), \
            tempfile.TemporaryDirectory() as out:
        for number, overrides in enumerate(trials):
            cfg = compose("train", overrides=overrides)
            accuracy = train.run_trial(cfg, output_dir=out, trial_number=number)
            if record_dir:
                probe = {"trial_number": number, "rank": rank, "overrides": overrides, **memory_probe()}
                Path(record_dir, f"memory_trial{number}_rank{rank}.json").write_text(json.dumps(probe, indent=1))
            print(f"trial {number} {overrides}: eval_accuracy={accuracy:.4f}", flush=True)


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except BaseException:
        traceback.print_exc()
        exit_cleanly(1)
    exit_cleanly(0)
