"""Run several trials of examples/train.py back to back in one process (one torchrun world), without a sweeper.

Usage: ``trial_loop.py '<json list of override lists>'``. Each inner list is one trial's Hydra overrides,
composed with Hydra's compose API from ``conf/train.yaml``; trial ``i`` gets job number ``i``. With
``DSO_RECORD_DIR`` set, every rank writes one record per trial (see ``examples/train.py``). The process ends
through ``exit_cleanly`` with status 0 once every trial has run, 1 on the first error.
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))

from hydra import compose, initialize_config_dir  # noqa: E402

import train  # noqa: E402  (examples/train.py)
from hydra_plugins.ds_optuna_sweeper import exit_cleanly  # noqa: E402


def main(trials: list[list[str]]) -> None:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"), \
            tempfile.TemporaryDirectory() as out:
        for number, overrides in enumerate(trials):
            cfg = compose("train", overrides=overrides)
            accuracy = train.run_trial(cfg, output_dir=out, trial_number=number)
            print(f"trial {number} {overrides}: eval_accuracy={accuracy:.4f}", flush=True)


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except BaseException:
        traceback.print_exc()
        exit_cleanly(1)
    exit_cleanly(0)
