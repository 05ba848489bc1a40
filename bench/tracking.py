"""Tracking (issue 25): what one run per trial in MLflow, TensorBoard and W&B costs a sweep.

Arms, the same sweep of ``--trials`` trials of the plain DDP example ``examples/ddp_mlp.py`` (2 ranks, learning
rate searched, sampler seed 0, median pruner, no plots), each on a fresh sweep dir and study:

- ``off``: no tracking;
- ``mlflow``: ``hydra.sweeper.tracking.report_to=[mlflow]`` (the embedded SQLite store in the sweep dir);
- ``all``: ``[mlflow,tensorboard,wandb]`` with W&B offline.

Arms alternate, ``--repeat`` rounds. Measured: wall seconds of the whole launch (start-up included: importing
MLflow and W&B, creating the MLflow store) and the median seconds from a trial's ask to its tell (Optuna's
``datetime_start``/``datetime_complete``: the run's creation at ask falls inside, the writes after the tell do
not; the wall time holds both). No target is set by the issue; docs/performance.md reports the figures.

    python bench/tracking.py --trials 6 --repeat 2     # about 4 minutes on 2 idle cores

Writes ``bench/results/tracking.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, median, save, torchrun  # noqa: E402

ARMS = {
    "off": [],
    "mlflow": ["hydra.sweeper.tracking.report_to=[mlflow]"],
    "all": ["hydra.sweeper.tracking.report_to=[mlflow,tensorboard,wandb]", "hydra.sweeper.tracking.wandb.mode=offline"],
}


def run_arm(work: Path, name: str, round_: int, a: argparse.Namespace) -> dict:
    """One launch of arm ``name``: wall seconds and the trials' ask-to-tell seconds."""
    sweep = work / f"{name}_{round_}"
    args = ["-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={a.trials}", f"epochs={a.epochs}",
            "hydra.sweeper.plots=false", "hydra.sweeper.sampler.seed=0", *ARMS[name]]
    t0 = time.monotonic()
    rc = torchrun(2, "examples/ddp_mlp.py", args, timeout_s=a.timeout, log_path=work / f"{name}_{round_}.log")
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"arm {name} failed (rc {rc}); see {work / f'{name}_{round_}.log'}")
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep}/optuna.db")
    trial_s = [t.duration.total_seconds() for t in study.trials if t.duration is not None]
    return {"wall_s": wall, "trial_s": trial_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    runs: dict[str, list[dict]] = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench_tracking_") as tmp:
        for round_ in range(a.repeat):
            for name in ARMS:
                runs[name].append(run_arm(Path(tmp), name, round_, a))
    summary = {name: {"wall_s": median([r["wall_s"] for r in rs]),
                      "trial_s": median([s for r in rs for s in r["trial_s"]])} for name, rs in runs.items()}
    off = summary["off"]
    rows = [[name, f"{s['wall_s']:.1f}", f"{s['wall_s'] - off['wall_s']:+.1f}",
             f"{(s['wall_s'] - off['wall_s']) / a.trials:+.2f}", f"{s['trial_s']:.2f}",
             f"{s['trial_s'] - off['trial_s']:+.2f}"] for name, s in summary.items()]
    table = markdown_table(["arm", "wall s (median)", "vs off", "per trial", "ask-to-tell s (median)", "vs off"], rows)
    table += (f"\n\n{a.trials} trials of examples/ddp_mlp.py (2 ranks, {a.epochs} epochs), {a.repeat} rounds, arms "
              "alternating; all = mlflow + tensorboard + wandb (offline).")
    save("tracking", table, {"runs": runs, "summary": summary, "args": vars(a)},
         f"python bench/tracking.py --trials {a.trials} --epochs {a.epochs} --repeat {a.repeat}")


if __name__ == "__main__":
    main()
