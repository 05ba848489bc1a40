"""Schedulers on the main job (issue 41): PBT vs the best fixed configuration, promotion ASHA vs the stopping pruners.

The main job (``examples/train.py``: the packaged MiniLM fine-tuned on TREC-6 questions, HF Trainer with DeepSpeed
ZeRO-2, 2 ranks under torchrun, CPU) on a slice of the data (``--train-size`` rows, ``--eval-size`` for the
eval accuracy), one epoch, evaluated every quarter epoch; its pruning callback reports the eval accuracy at the
epoch fraction in thousandths (250, 500, 750, 1000). The arms (``--arms``), with the same TPE seed over the job's
own search space (``conf/train.yaml``: learning rate, warm-up, weight decay):

- ``none``: no early stopping (``hydra/sweeper/pruner=nop``), each configuration trains the whole epoch;
- ``pbt``: ``hydra/sweeper/scheduler=pbt`` with ``interval=250``, ``max_steps=1000`` and the learning rate
  mutable (Ray Tune's defaults otherwise): the members pause at each quarter and the bottom quarter copies a top
  member's Trainer checkpoint (weights, optimizer, scheduler) with a perturbed or resampled learning rate;
- ``median``: the job's own pruner (``conf/train.yaml``: ``median_train``, the median from half an epoch);
- ``successive_halving``: Optuna's ``SuccessiveHalvingPruner`` with its defaults;
- ``asha``: promotion ASHA with ``min_steps=250``, ``max_steps=1000``, ``reduction_factor=2`` (rungs at a quarter
  and half an epoch: with four reports a configuration, eta 2 gives two rungs).

Every arm gets the same budget in quarters, ``--configs`` full configurations (what ``none`` spends): an arm that
stops or pauses trials is given ``--configs`` times its factor in :data:`CONFIGS` and read up to the budget
(``bench/schedulers.py``'s reader: the trials in the order they finished, each trial's own reports counted; a
clone's copied ones are not). Targets (issue 41): PBT's best at least the best fixed configuration's (``none``'s
best) at equal or fewer steps; promotion ASHA reaches the best stopping arm's best with at most 70% of its quarters
(:func:`schedulers.verdict`).

    python bench/schedulers_main.py [--configs 6] [--seeds 0] [--arms none pbt] [--train-size 512] [--eval-size 128]

The arms ``none pbt`` write ``bench/results/schedulers_main_pbt.md``, others ``schedulers_main_<arms but none>.md``.
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
    "median": [],  # conf/train.yaml's median_train
    "successive_halving": ["hydra/sweeper/pruner=successive_halving"],
    "asha": ["hydra/sweeper/pruner=nop", "hydra/sweeper/scheduler=asha", "hydra.sweeper.scheduler.min_steps=250",
             "hydra.sweeper.scheduler.max_steps=1000", "hydra.sweeper.scheduler.reduction_factor=2"],
}
CONFIGS = {"none": 1, "pbt": 1, "median": 2, "successive_halving": 3, "asha": 3}
QUARTERS = 4  # reports per configuration


def run(arm: str, seed: int, configs: int, data: list[str], workdir: Path) -> dict:
    """One sweep of ``arm`` (``configs * CONFIGS[arm]`` configurations); its figures (:func:`schedulers.read_study`),
    wall seconds and what it found within ``configs * QUARTERS`` quarters (:func:`schedulers.within_budget`)."""
    args = [f"hydra.sweeper.n_trials={configs * CONFIGS[arm]}", f"hydra.sweeper.study_name={STUDY}",
            f"hydra.sweeper.sampler.seed={seed}", "hydra.sweeper.plots=false", "hydra.sweeper.enqueue_trials=null",
            *data, *ARMS[arm]]
    res = schedulers.timed_sweep(SCRIPT, STUDY, f"{arm}_seed{seed}", args, workdir, timeout_s=3600)
    res["budget"] = schedulers.within_budget(res, configs * QUARTERS)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=6, help="the budget in full configurations (none's, pbt's members)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="TPE sampler seeds")
    ap.add_argument("--arms", nargs="+", default=["none", "pbt"], choices=list(ARMS))
    ap.add_argument("--train-size", type=int, default=512)
    ap.add_argument("--eval-size", type=int, default=128)
    args = ap.parse_args()
    arms = ["none"] + [a for a in args.arms if a != "none"]  # none is every target's baseline
    data_args = [f"data.train_size={args.train_size}", f"data.eval_size={args.eval_size}"]
    out: dict = {"configs": args.configs, "nproc": NPROC, "data": data_args, "arms": {a: ARMS[a] for a in arms},
                 "seeds": {}}
    rows, pbt_rows, asha_rows = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            res = {arm: run(arm, seed, args.configs, data_args, Path(tmp)) for arm in arms}
            for arm, r in res.items():
                b = r["budget"]
                rows.append([seed, arm, r["configurations"], r["trials"], r["complete"], r["epochs"],
                             f"{r['epochs'] / res['none']['epochs']:.0%}", f"{r['wall_s']:.0f}",
                             schedulers._fmt(r["best"], ".4f"), b["epochs"], "yes" if b["filled"] else "no",
                             schedulers._fmt(b["best"], ".4f")])
                print(rows[-1], flush=True)
            entry = out["seeds"][str(seed)] = {"results": res}
            if "pbt" in res:
                met = (res["pbt"]["best"] is not None and res["pbt"]["best"] >= res["none"]["best"]
                       and res["pbt"]["epochs"] <= res["none"]["epochs"])
                pbt_rows.append([seed, schedulers._fmt(res["none"]["best"], ".4f"), res["none"]["epochs"],
                                 schedulers._fmt(res["pbt"]["best"], ".4f"), res["pbt"]["epochs"],
                                 "met" if met else "**missed**"])
                entry["met"] = met
            if {"median", "successive_halving", "asha"} <= set(res):
                v = entry["asha_verdict"] = schedulers.verdict(res)
                asha_rows.append([seed, v["reference"], schedulers._fmt(v["reference_best"], ".4f"),
                                  v["reference_epochs"], schedulers._fmt(v["reference_epochs_to_its_best"], "d"),
                                  schedulers._fmt(v["asha_best"], ".4f"), schedulers._fmt(v["asha_epochs_to_reach"], "d"),
                                  schedulers._fmt(v["epoch_fraction"], ".0%"), "met" if v["met"] else "**missed**"])
    lines = [markdown_table(["seed", "arm", "configurations", "trials", "complete", "quarters trained", "vs none",
                             "wall s", "best eval accuracy", "quarters within budget", "budget filled",
                             "best within budget"], rows)]
    if pbt_rows:
        n_met = sum(1 for v in pbt_rows if v[-1] == "met")
        lines += ["", markdown_table(["seed", "none best (best fixed configuration)", "none quarters", "pbt best",
                                      "pbt quarters", "target"], pbt_rows), "",
                  f"Target (PBT's best at least the best fixed configuration's, with no more steps): met in {n_met} of "
                  f"{len(pbt_rows)} seed(s)."]
    if asha_rows:
        n_met = sum(1 for v in asha_rows if v[-1] == "met")
        lines += ["", markdown_table(["seed", "best stopping arm", "its best", "its quarters", "its quarters to its best",
                                      "asha best", "asha quarters to reach its best", "asha / its quarters", "target"],
                                     asha_rows), "",
                  f"Target (ASHA reaches the best stopping arm's best with at most {schedulers.TARGET_FRACTION:.0%} of "
                  f"its quarters, within the budget): met in {n_met} of {len(asha_rows)} seed(s)."]
    lines += ["", f"Settings: {NPROC} ranks (torchrun), `{SCRIPT}` (HF Trainer + DeepSpeed ZeRO-2, MiniLM, one epoch, "
              f"{' '.join(data_args)}), a budget of {args.configs} configurations x {QUARTERS} quarters per arm, "
              "n_trials = " + ", ".join(f"{args.configs * CONFIGS[a]} ({a})" for a in arms) + ", TPE seeds "
              + ", ".join(map(str, args.seeds)) + "; arms: "
              + "; ".join(f"{a}: `{' '.join(ARMS[a]) or '(conf/train.yaml: median_train)'}`" for a in arms)
              + ". A quarter is one report (a quarter epoch)."]
    name = "schedulers_main_" + "_".join(a for a in arms if a != "none")
    save(name, "\n".join(lines), out, "python bench/schedulers_main.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
