"""Test app of the refit and rerun launch at 2 ranks (cases C19, C49): ``tests/apps/rerun_app.py``'s task, and
each rank writes its run dir to ``$DSO_RECORD_DIR/dir_<sweep|single>_<stage>_<trial or run>_rank<R>.json``.
``DSO_DELAY_RANK``/``DSO_DELAY_S``: that rank starts later, so Hydra's ``${now:...}`` run dir would differ per
rank if the line did not fix it (case C49). Configs: ``conf_rerun`` (as ``rerun_app.py``).
"""

import json
import os
import time
from pathlib import Path

if os.environ.get("DSO_DELAY_RANK") == os.environ.get("RANK", "0"):
    time.sleep(float(os.environ.get("DSO_DELAY_S", "1.5")))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import rerun_app  # noqa: E402  tests/apps/rerun_app.py (the script's folder is on sys.path)
from exit_record import run_recorded  # noqa: E402
from hydra_plugins.ds_optuna_sweeper import in_trial  # noqa: E402


@hydra.main(config_path="conf_rerun", config_name="rerun", version_base="1.3")
def main(cfg: DictConfig):
    result = rerun_app.main.__wrapped__(cfg)
    hc = HydraConfig.get()
    mode = "sweep" if hc.mode.name == "MULTIRUN" else "single"
    tag = hc.job.num if mode == "sweep" and in_trial() else "run"
    out = Path(os.environ["DSO_RECORD_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    (out / f"dir_{mode}_{cfg.stage}_{tag}_rank{rank}.json").write_text(json.dumps({"output_dir": hc.runtime.output_dir}))
    return result


if __name__ == "__main__":
    run_recorded(main)
