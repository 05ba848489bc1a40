"""Pruning savings: the same sweep with and without a pruner (same sampler seed, same trials).

For each job, two sweeps under torchrun (2 ranks): no pruning (a median pruner that never leaves its
start-up phase, ``_common.NO_PRUNING``; labelled ``none``) and the median pruner. Every trial records its optimizer steps in the user attribute
``optimizer_steps`` (examples/ddp_mlp.py directly; examples/train.py through the HF pruning
callback). Prints total optimizer steps, wall time and best value; target: at least 40% fewer steps
at an equal or better best value.

    python bench/pruning.py [--jobs mlp train] [--trials 16]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import NO_PRUNING, markdown_table, save, torchrun  # noqa: E402

JOBS = {
    # script, study name, extra overrides (same sampler seed in both arms)
    "mlp": ("examples/ddp_mlp.py", "ddp_mlp", ["hydra.sweeper.sampler.seed=0", "epochs=15"]),
    "train": ("examples/train.py", "train", ["hydra.sweeper.sampler.seed=0", "hydra.sweeper.enqueue_trials=null"]),
}
PRUNERS = {
    "none": NO_PRUNING,
    "median": ["hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=4",
               "hydra.sweeper.pruner.n_warmup_steps=1"],
}


def run(job: str, pruner: str, trials: int, workdir: Path) -> dict:
    import optuna

    script, study_name, extra = JOBS[job]
    sweep = workdir / f"{job}_{pruner}"
    args = ["-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.study_name={study_name}",
            "hydra.sweeper.plots=false", *extra, *PRUNERS[pruner]]
    t0 = time.monotonic()
    rc = torchrun(2, script, args, timeout_s=3600, log_path=workdir / f"{job}_{pruner}.log")
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"{job} with pruner {pruner} failed (exit {rc}); see {workdir}/{job}_{pruner}.log")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{sweep}/optuna.db")
    steps = [t.user_attrs.get("optimizer_steps") for t in study.trials]
    if any(s is None for s in steps):
        raise SystemExit(f"{job}: a trial did not record optimizer_steps")
    states = {}
    for t in study.trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    return {"steps": sum(steps), "wall_s": wall, "best": study.best_value, "states": states}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", default=["mlp", "train"], choices=sorted(JOBS))
    ap.add_argument("--trials", type=int, default=16)
    args = ap.parse_args()
    rows, data = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for job in args.jobs:
            res = {p: run(job, p, args.trials, Path(tmp)) for p in PRUNERS}
            data[job] = res
            base = res["none"]
            for p, r in res.items():
                saved = 1 - r["steps"] / base["steps"]
                wall_saved = 1 - r["wall_s"] / base["wall_s"]
                rows.append([job, p, args.trials, r["steps"], f"{saved:.0%}", f"{r['wall_s']:.0f}", f"{wall_saved:.0%}",
                             f"{r['best']:.4f}",
                             " ".join(f"{k}:{v}" for k, v in sorted(r["states"].items()))])
                print(rows[-1], flush=True)
    table = markdown_table(["job", "pruner", "trials", "optimizer steps", "steps saved", "wall s", "wall saved", "best value",
                            "states"], rows)
    save("pruning", table, {"trials": args.trials, "results": data}, "python bench/pruning.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
