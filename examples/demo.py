"""`make demo`: the main job's sweep on 2 ranks, the refit, then one table of defaults vs the best found.

    python examples/demo.py [--nproc 2] [-- <Hydra overrides>]

Runs ``torchrun --standalone --nproc_per_node <nproc> examples/train.py -m hydra.sweeper.refit.enabled=true
<overrides>`` with the embedded default storage (sqlite in the sweep dir). The first two trials of a new
study are the warm starts of conf/train.yaml (the example's hand-picked default, then TrainingArguments' own
defaults); after the search, the refit (``data.stage=final``) retrains them and the best trial on train +
eval and scores each on the held-out test rows. The table at the end puts the eval accuracy each had in the
search next to its test accuracy after the refit. Without ``hydra.sweep.dir=`` among the overrides a new
sweep dir ``multirun/demo-<time>`` is used; pass the same ``hydra.sweep.dir`` again to resume that study up
to ``hydra.sweeper.n_trials`` (the refit runs again at the end).
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


def _key(params: dict) -> tuple:
    return tuple(sorted((k, float(v) if isinstance(v, (int, float)) else v) for k, v in params.items()))


def _warm_start_names() -> dict[tuple, str]:
    """conf/train.yaml's warm starts by their params: the first is the hand-picked default, the second
    TrainingArguments' own defaults."""
    from omegaconf import OmegaConf

    names = ["hand-picked default", "TrainingArguments defaults"]
    entries = OmegaConf.load(REPO / "conf" / "train.yaml").hydra.sweeper.enqueue_trials or []
    return {_key(dict(e)): name for name, e in zip(names, entries)}


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
    if _override(overrides, "hydra.sweeper.refit.enabled") is None:
        overrides.insert(0, "hydra.sweeper.refit.enabled=true")

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
    warm_names = _warm_start_names()
    rows: list[tuple[str, optuna.trial.FrozenTrial]] = []
    for t in sorted(study.trials, key=lambda t: t.number):
        if t.user_attrs.get("ds_optuna:enqueued"):
            name = warm_names.get(_key(t.params), f"warm start (trial {t.number})")
            rows.append((name, t))
    if "best_trial" in results:
        rows.append(("best found", study.trials[int(results.best_trial)]))
    refits = {int(r.trial): r for r in results.get("refit") or []}

    def test_cell(number: int) -> str:
        r = refits.get(number)
        if r is None:
            return "-"
        if r.state != "COMPLETE" or "test_accuracy" not in r.metrics:
            return r.state
        return f"{r.metrics.test_accuracy:.4f}"

    def eval_cell(t: optuna.trial.FrozenTrial) -> str:
        return f"{t.value:.4f}" if t.values else t.state.name

    print()
    print(f"Sweep of {results.n_trials} trials on {args.nproc} ranks, refit included, in {wall:.0f} s; "
          f"states {dict(results.states)}")
    print(f"Sweep dir: {sweep_path}")
    print()
    header = ["config", "trial", "lr", "warmup", "weight decay", "eval acc (search)", "test acc (refit)"]
    table = [header] + [
        [name, str(t.number), f"{t.params.get('training.learning_rate', float('nan')):.3g}",
         f"{t.params.get('training.warmup_steps', float('nan')):.3g}",
         f"{t.params.get('training.weight_decay', float('nan')):.3g}", eval_cell(t), test_cell(t.number)]
        for name, t in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for i, r in enumerate(table):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print()
    print("eval acc: the search's objective (last evaluation on the eval slice, training on the train slice);")
    print("test acc: the refit (data.stage=final: train + eval, then the held-out test rows, scored once).")
    if "best_trial" in results:
        print(f"rerun the best config: {results.rerun_command}")
        best_refit = refits.get(int(results.best_trial))
        if best_refit is not None:
            print(f"rerun its refit:       {best_refit.rerun_command}")
    print(f"resume / extend: make demo ARGS='hydra.sweep.dir={sweep_path} hydra.sweeper.n_trials=<more>'")
    print(f"plots: {sweep_path / 'plots'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
