"""One ds_optuna sweep in one torchrun world vs one torchrun launch per trial.

(a) ``torchrun examples/train.py -m`` runs N trials in one world (process start, imports and the
process group paid once); (b) a plain loop launches ``torchrun examples/train.py <overrides>`` once
per trial with the same params that (a) sampled (what Hydra's torchrun/submitit launchers do:
process start, imports, process-group set-up and model load every trial). Both on a small data slice
so the fixed costs show. Prints both wall times and the ratio (target: (a) at least 3x faster).

    python bench/vs_relaunch.py [--trials 6] [--nproc 2]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import markdown_table, save, torchrun  # noqa: E402

SMALL = ["data.train_size=64", "data.eval_size=32", "training.eval_steps=0.5", "training.logging_steps=0.5"]


def main() -> None:
    import optuna

    from hydra_plugins.ds_optuna_sweeper._study._override_text import override_line

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep"
        t0 = time.monotonic()
        rc = torchrun(args.nproc, "examples/train.py",
                      ["-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={args.trials}", "hydra.sweeper.plots=false",
                       "hydra.sweeper.sampler.seed=0", *SMALL],
                      timeout_s=3600, log_path=Path(tmp) / "sweep.log")
        sweep_s = time.monotonic() - t0
        if rc != 0:
            raise SystemExit(f"sweep failed ({rc}); see {tmp}/sweep.log")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name="train", storage=f"sqlite:///{sweep}/optuna.db")
        t0 = time.monotonic()
        for t in study.trials:
            overrides = [*SMALL, f"hydra.run.dir={Path(tmp) / 'relaunch' / str(t.number)}"]
            overrides += [override_line(k, v) for k, v in t.params.items()]
            rc = torchrun(args.nproc, "examples/train.py", overrides, timeout_s=1800,
                          log_path=Path(tmp) / f"relaunch_{t.number}.log")
            if rc != 0:
                raise SystemExit(f"relaunch of trial {t.number} failed ({rc}); see {tmp}/relaunch_{t.number}.log")
        relaunch_s = time.monotonic() - t0
    rows = [
        ["(a) ds_optuna, one torchrun world", args.trials, f"{sweep_s:.1f}", f"{sweep_s / args.trials:.1f}"],
        ["(b) one torchrun launch per trial", args.trials, f"{relaunch_s:.1f}", f"{relaunch_s / args.trials:.1f}"],
    ]
    table = markdown_table(["how", "trials", "wall s", "s per trial"], rows)
    table += f"\n\nRatio (b)/(a): **{relaunch_s / sweep_s:.2f}x** ({args.nproc} ranks, data slice: {' '.join(SMALL)})"
    save("vs_relaunch", table, {"trials": args.trials, "nproc": args.nproc, "sweep_s": sweep_s, "relaunch_s": relaunch_s},
         "python bench/vs_relaunch.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
