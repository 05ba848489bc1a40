"""ds_optuna vs ``Trainer.hyperparameter_search(backend="optuna")`` under torchrun, same task and trials.

Both run the main job (MiniLM on a TREC-6 slice, HF Trainer + DeepSpeed ZeRO-2, 2 CPU ranks) for N trials
with the same search space and TPE seed: (a) ``torchrun examples/train.py -m``; (b)
``torchrun bench/hf_search_app.py``. Prints both wall times and the ratio (target: ours at most 1.05x
theirs). transformers' search has no rank-consistent pruning or failure handling: other ranks loop a fixed
number of times, and an exception on one rank hangs the others.

    python bench/vs_transformers.py [--trials 6] [--nproc 2]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import NO_PRUNING, markdown_table, save, torchrun  # noqa: E402

SMALL = ["data.train_size=128", "data.eval_size=64"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="alternate the two this many times; medians reported")
    args = ap.parse_args()
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            t0 = time.monotonic()
            rc = torchrun(args.nproc, "examples/train.py",
                          ["-m", f"hydra.sweep.dir={tmp}/sweep{i}", f"hydra.sweeper.n_trials={args.trials}",
                           "hydra.sweeper.plots=false", "hydra.sweeper.sampler.seed=0",
                           "hydra.sweeper.enqueue_trials=null", *NO_PRUNING, *SMALL],
                          timeout_s=3600, log_path=Path(tmp) / f"ours{i}.log")
            ours.append(time.monotonic() - t0)
            if rc != 0:
                raise SystemExit(f"ds_optuna sweep failed ({rc}); see {tmp}/ours{i}.log")
            t0 = time.monotonic()
            rc = torchrun(args.nproc, "bench/hf_search_app.py", [str(args.trials), *SMALL], timeout_s=3600,
                          log_path=Path(tmp) / f"theirs{i}.log")
            theirs.append(time.monotonic() - t0)
            if rc != 0:
                raise SystemExit(f"hyperparameter_search failed ({rc}); see {tmp}/theirs{i}.log")
    o, t = sorted(ours)[len(ours) // 2], sorted(theirs)[len(theirs) // 2]
    rows = [["(a) ds_optuna sweep", args.trials, f"{o:.1f}", " ".join(f"{x:.1f}" for x in ours)],
            ["(b) Trainer.hyperparameter_search", args.trials, f"{t:.1f}", " ".join(f"{x:.1f}" for x in theirs)]]
    table = markdown_table(["how", "trials", "median wall s", "runs"], rows)
    table += f"\n\nRatio (a)/(b): **{o / t:.2f}x** ({args.nproc} ranks, {' '.join(SMALL)}, whole torchrun command each)"
    save("vs_transformers", table, {"trials": args.trials, "ours_s": ours, "theirs_s": theirs},
         "python bench/vs_transformers.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
