"""`make demo`: the main job's sweep on 2 ranks, then the best trial next to the default config.

    python examples/demo.py [--nproc 2] [-- <Hydra overrides>]

Runs ``torchrun --standalone --nproc_per_node <nproc> examples/train.py -m <overrides>`` with the
embedded default storage (sqlite in the sweep dir). The first trial of a new study is the default
config (``hydra.sweeper.enqueue_trials`` in conf/train.yaml), so the comparison costs no extra run.
Without ``hydra.sweep.dir=`` among the overrides a new sweep dir ``multirun/demo-<time>`` is used;
pass the same ``hydra.sweep.dir`` again to resume that study up to ``hydra.sweeper.n_trials``.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _override(overrides: list[str], key: str) -> str | None:
    for o in overrides:
        if o.lstrip("+").startswith(key + "="):
            return o.split("=", 1)[1].strip("'\"")
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (torchrun --nproc_per_node)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the sweep, after --")
    args = ap.parse_args()
    overrides = list(args.overrides)
    sweep_dir = _override(overrides, "hydra.sweep.dir")
    if sweep_dir is None:
        sweep_dir = str(REPO / "multirun" / time.strftime("demo-%Y-%m-%d_%H-%M-%S"))
        overrides.append(f"hydra.sweep.dir={sweep_dir}")
    sweep_path = Path(sweep_dir if os.path.isabs(sweep_dir) else REPO / sweep_dir)

    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
           "examples/train.py", "-m", *overrides]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    rc = subprocess.call(cmd, cwd=REPO, env=env)
    wall = time.monotonic() - t0
    if rc != 0:
        print(f"sweep failed with exit code {rc}; logs are in {sweep_path}", file=sys.stderr)
        return rc

    import optuna
    from omegaconf import OmegaConf

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = OmegaConf.load(sweep_path / "optimization_results.yaml")
    storage = _override(overrides, "hydra.sweeper.storage") or f"sqlite:///{sweep_path}/optuna.db"
    study = optuna.load_study(study_name=results.study_name, storage=storage)
    default = next((t for t in study.trials if t.user_attrs.get("ds_optuna:enqueued") and t.values), None)
    print()
    print(f"Sweep of {results.n_trials} trials on {args.nproc} ranks in {wall:.0f} s; states {dict(results.states)}")
    print(f"Sweep dir: {sweep_path}")
    if default is not None:
        print(f"  default config (trial {default.number}):  eval accuracy {default.value:.4f}")
    if "best_value" in results:
        print(f"  best trial {results.best_trial}:             eval accuracy {results.best_value:.4f}")
        for k, v in results.best_params.items():
            print(f"      {k} = {v}")
        print(f"  rerun the best config: {results.rerun_command}")
    print(f"  resume / extend: make demo ARGS='hydra.sweep.dir={sweep_path} hydra.sweeper.n_trials=<more>'")
    print(f"  plots: {sweep_path / 'plots'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
