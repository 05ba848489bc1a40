"""PBT on the main job (issue 41): population-based training vs the best fixed configuration.

The main job (``examples/train.py``: the packaged MiniLM fine-tuned on TREC-6 questions, HF Trainer with DeepSpeed
ZeRO-2, 2 ranks under torchrun, CPU) on a slice of the data (``--train-size`` rows, ``--eval-size`` for the
eval accuracy), one epoch, evaluated every quarter epoch; its pruning callback reports the eval accuracy at the
epoch fraction in thousandths (250, 500, 750, 1000). Two arms with the same TPE seed and the same number of
configurations (``--configs``) over the job's own search space (``conf/train.yaml``: learning rate, warm-up,
weight decay):

- ``none``: no early stopping (``hydra/sweeper/pruner=nop``), each configuration trains the whole epoch;
- ``pbt``: ``hydra/sweeper/scheduler=pbt`` with ``interval=250``, ``max_steps=1000`` and the learning rate
  mutable (Ray Tune's defaults otherwise): the members pause at each quarter and the bottom quarter copies a top
  member's Trainer checkpoint (weights, optimizer, scheduler) with a perturbed or resampled learning rate.

Each study is read back (``bench/schedulers.py``'s reader): best eval accuracy, quarters trained (each member's own
reports; a clone's copied ones are not counted), trials, wall time. Target (issue 41): PBT's best at least the
best fixed configuration's (``none``'s best) at equal or fewer steps.

    python bench/schedulers_main.py [--configs 6] [--seeds 0] [--train-size 512] [--eval-size 128]
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import schedulers  # noqa: E402  (its study reader)
from _common import markdown_table, save  # noqa: E402

SCRIPT, STUDY, NPROC = "examples/train.py", "train", 2
ARMS = {
    "none": ["hydra/sweeper/pruner=nop"],
    "pbt": ["hydra/sweeper/pruner=nop", "hydra/sweeper/scheduler=pbt", "hydra.sweeper.scheduler.interval=250",
            "hydra.sweeper.scheduler.max_steps=1000", "hydra.sweeper.scheduler.mutations=[training.learning_rate]"],
}


def run(arm: str, seed: int, configs: int, data: list[str], workdir: Path) -> dict:
    """One sweep of ``arm``; its figures (:func:`schedulers.read_study`) and wall seconds."""
    args = [f"hydra.sweeper.n_trials={configs}", f"hydra.sweeper.study_name={STUDY}", f"hydra.sweeper.sampler.seed={seed}",
            "hydra.sweeper.plots=false", "hydra.sweeper.enqueue_trials=null", *data, *ARMS[arm]]
    return schedulers.timed_sweep(SCRIPT, STUDY, f"{arm}_seed{seed}", args, workdir, timeout_s=3600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=6, help="configurations (none) and members (pbt)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="TPE sampler seeds")
    ap.add_argument("--train-size", type=int, default=512)
    ap.add_argument("--eval-size", type=int, default=128)
    args = ap.parse_args()
    data_args = [f"data.train_size={args.train_size}", f"data.eval_size={args.eval_size}"]
    out: dict = {"configs": args.configs, "nproc": NPROC, "data": data_args, "arms": ARMS, "seeds": {}}
    rows, verdicts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            res = {arm: run(arm, seed, args.configs, data_args, Path(tmp)) for arm in ARMS}
            for arm, r in res.items():
                rows.append([seed, arm, r["configurations"], r["trials"], r["complete"], r["epochs"],
                             f"{r['epochs'] / res['none']['epochs']:.0%}", f"{r['wall_s']:.0f}",
                             schedulers._fmt(r["best"], ".4f")])
                print(rows[-1], flush=True)
            met = (res["pbt"]["best"] is not None and res["pbt"]["best"] >= res["none"]["best"]
                   and res["pbt"]["epochs"] <= res["none"]["epochs"])
            verdicts.append([seed, schedulers._fmt(res["none"]["best"], ".4f"), res["none"]["epochs"],
                             schedulers._fmt(res["pbt"]["best"], ".4f"), res["pbt"]["epochs"],
                             "met" if met else "**missed**"])
            out["seeds"][str(seed)] = {"results": res, "met": met}
    n_met = sum(1 for v in verdicts if v[-1] == "met")
    table = "\n".join([
        markdown_table(["seed", "arm", "configurations", "trials", "complete", "quarters trained", "vs none", "wall s",
                        "best eval accuracy"], rows), "",
        markdown_table(["seed", "none best (best fixed configuration)", "none quarters", "pbt best", "pbt quarters",
                        "target"], verdicts), "",
        f"Target (PBT's best at least the best fixed configuration's, with no more steps): met in {n_met} of "
        f"{len(verdicts)} seed(s).", "",
        f"Settings: {NPROC} ranks (torchrun), `{SCRIPT}` (HF Trainer + DeepSpeed ZeRO-2, MiniLM, one epoch, "
        f"{' '.join(data_args)}), {args.configs} configurations / members, TPE seeds "
        + ", ".join(map(str, args.seeds)) + "; arms: " + "; ".join(f"{a}: `{' '.join(v)}`" for a, v in ARMS.items())
        + ". A quarter is one report (a quarter epoch)."])
    save("schedulers_main_pbt", table, out, "python bench/schedulers_main.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
