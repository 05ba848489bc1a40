"""`make demo`: the main job's sweep on 2 ranks, the refit, then one table of two baselines vs the best found.

    python examples/demo.py [--nproc 2] [--budget 150] [--n-jobs 1] [-- <Hydra overrides>]

Runs ``torchrun --standalone --nproc_per_node <nproc> examples/train.py -m hydra.sweeper.refit.enabled=true
hydra.sweeper.timeout=<budget> hydra.sweeper.n_trials=100 <overrides>`` with the embedded default storage (sqlite
in the sweep dir): a search of ``--budget`` seconds from nothing (no warm start), then the refit
(``data.stage=final``) retrains the best trial and conf/train.yaml's two ``refit.baselines`` (the example's
hand-picked default and TrainingArguments' own defaults) on train + eval and scores each on the held-out test
rows. The table at the end puts the eval accuracy the best trial had in the search next to the test accuracy of
all three. Without ``hydra.sweep.dir=`` among the overrides a new sweep dir ``multirun/demo-<time>`` is used;
pass the same ``hydra.sweep.dir`` again to search that study for another budget (the refit runs again at the end).

The table and the timings (wall seconds of the torchrun command, its children's user and system CPU seconds, the
search's span from the first trial's start to the last trial's end, the load average before the start, the
trials' states and durations) are also written to ``demo.md`` and ``demo.json`` in the sweep dir (``--results DIR``
for another folder, ``--results ''`` for none). The README's demo figures come from ``bench/results/demo.md``, which
only ``--results bench/results`` rewrites: a plain ``make demo`` leaves the committed result as it is (issue 38, C59:
it rewrote them, and ``tests/test_bench_results.py`` failed after a new user's first demo).
"""

import argparse
import json
import os
import resource
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


BASELINE_NAMES = {"hand_picked_default": "hand-picked default", "trainingarguments_defaults": "TrainingArguments defaults"}
SEARCHED = ("training.learning_rate", "training.warmup_steps", "training.weight_decay")


def _refit_values(job_dir: str) -> dict:
    """The searched keys' values a refit run trained with, from its job's composed config (``.hydra/config.yaml``)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(job_dir) / ".hydra" / "config.yaml")
    return {key: OmegaConf.select(cfg, key) for key in SEARCHED}


def _timings(study, wall: float, children: resource.struct_rusage, load_before: float) -> dict:
    """Seconds: the whole command, its children's CPU, the search (first trial start to last trial end) and the
    rest (start-up, refit, results, plots); per state, the trials' count and their shortest and longest duration."""
    done = [t for t in study.trials if t.datetime_start and t.datetime_complete]
    search = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds() if done else 0.0
    states: dict[str, dict] = {}
    for t in done:
        s = states.setdefault(t.state.name, {"count": 0, "seconds": []})
        s["count"] += 1
        s["seconds"].append((t.datetime_complete - t.datetime_start).total_seconds())
    for s in states.values():
        s["min_s"], s["max_s"] = round(min(s["seconds"])), round(max(s["seconds"]))
        del s["seconds"]
    return {"wall_s": round(wall), "user_s": round(children.ru_utime), "system_s": round(children.ru_stime),
            "search_s": round(search), "refit_and_rest_s": round(wall - search),
            "load_average_before": round(load_before, 1), "states": states}


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60} min {int(seconds) % 60} s"


def _span(low: float, high: float) -> str:
    """``"29-35"``, or ``"15"`` when both ends are equal (one trial, or trials of the same length)."""
    return f"{low}" if low == high else f"{low}-{high}"


def _save(out: Path, table_lines: list[str], timings: dict, args: argparse.Namespace, rows: list[dict]) -> None:
    """``<out>/demo.md`` (the table and the timings, with the command and the machine) and ``demo.json``."""
    import platform

    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python examples/demo.py", "--nproc", str(args.nproc), "--budget", str(args.budget),
                        "--n-jobs", str(args.n_jobs), *(["--results", args.results] if args.results is not None else []),
                        *(["--", *args.overrides] if args.overrides else [])])
    states = ", ".join(f"{k} {v['count']} ({_span(v['min_s'], v['max_s'])} s{'' if v['count'] == 1 else ' each'})"
                       for k, v in sorted(timings["states"].items()))
    md = "\n".join([
        *table_lines, "",
        f"Wall time {_minutes(timings['wall_s'])} ({timings['wall_s']} s; CPU {timings['user_s']} s user + "
        f"{timings['system_s']} s system), search {_minutes(timings['search_s'])}, refit and the rest "
        f"{_minutes(timings['refit_and_rest_s'])}; load average {timings['load_average_before']} before the start.",
        f"Trials: {states}.", "",
        f"Command: `{command}`", "",
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}", ""])
    (out / "demo.md").write_text(md)
    data = {"command": command, "cores": os.cpu_count(), "python": platform.python_version(), **timings, "rows": rows}
    (out / "demo.json").write_text(json.dumps(data, indent=1, default=str))
    print(f"table and timings written to {out / 'demo.md'}")


def _plain(node):
    """An OmegaConf node as plain lists and dicts (None stays None), for JSON."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node) if node is not None else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo's command line (``argv`` defaults to ``sys.argv[1:]``); ``--results`` is None unless given."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (torchrun --nproc_per_node)")
    ap.add_argument("--budget", type=int, default=150,
                    help="seconds of search (hydra.sweeper.timeout: no trial is asked after it; running ones finish)")
    ap.add_argument("--n-jobs", type=int, default=1,
                    help="trials at once (hydra.sweeper.n_jobs; each gets nproc / n_jobs ranks)")
    ap.add_argument("--results", default=None,
                    help="folder for demo.md/.json (default: the sweep dir; bench/results rewrites the README's "
                         "committed figures; '' writes none)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the sweep, after --")
    return ap.parse_args(argv)


def results_folder(results: str | None, sweep_path: Path) -> Path | None:
    """Where ``demo.md``/``.json`` go: ``sweep_path`` when ``--results`` was not given, None for ``--results ''``.

    A relative folder is taken from the repository root (so ``--results bench/results`` means the committed one).
    """
    if results is None:
        return sweep_path
    if not results:
        return None
    return Path(results) if os.path.isabs(results) else REPO / results


def main() -> int:
    args = parse_args()
    overrides = list(args.overrides)
    sweep_dir = _override(overrides, "hydra.sweep.dir")
    if sweep_dir is None:
        sweep_dir = str(REPO / "multirun" / time.strftime("demo-%Y-%m-%d_%H-%M-%S"))
        overrides.append(f"hydra.sweep.dir={sweep_dir}")
    sweep_path = Path(sweep_dir if os.path.isabs(sweep_dir) else REPO / sweep_dir)
    defaults = {"hydra.sweeper.refit.enabled": "true", "hydra.sweeper.timeout": str(args.budget),
                "hydra.sweeper.n_trials": "100", "hydra.sweeper.n_jobs": str(args.n_jobs)}
    overrides[:0] = [f"{k}={v}" for k, v in defaults.items() if _override(overrides, k) is None]
    mlflow_store = None
    if _override(overrides, "hydra.sweeper.tracking.report_to") is None:  # one MLflow run per trial, with the
        overrides[:0] = ["hydra.sweeper.tracking.report_to=[mlflow]"]      # Trainer's curves in it (docs/how-to/tracking.md, "Tracking")
        if _override(overrides, "training.report_to") is None and _override(overrides, "+training.report_to") is None:
            overrides.insert(1, "+training.report_to=[mlflow]")
        if _override(overrides, "hydra.sweeper.tracking.mlflow.tracking_uri") is None:
            mlflow_store = f"sqlite:///{sweep_path}/mlflow.db"

    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
           "examples/train.py", "-m", *overrides]
    print("$", " ".join(cmd), flush=True)
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    rc = subprocess.call(cmd, cwd=REPO, env=env)
    wall = time.monotonic() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        print(f"sweep failed with exit code {rc}; logs are in {sweep_path}", file=sys.stderr)
        return rc

    import optuna
    from omegaconf import OmegaConf

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = OmegaConf.load(sweep_path / "optimization_results.yaml")
    storage = _override(overrides, "hydra.sweeper.storage") or f"sqlite:///{sweep_path}/optuna.db"
    study = optuna.load_study(study_name=results.study_name, storage=storage)
    refits = list(results.get("refit") or [])
    rows = []  # one per config: the baselines, any warm start, the best found
    for r in refits:
        if r.get("baseline"):
            rows.append({"config": BASELINE_NAMES.get(r.baseline, f"baseline {r.baseline}"), "trial": None,
                         "values": _refit_values(r.job_dir), "eval_accuracy": None, "refit": r})
    by_trial = {int(r.trial): r for r in refits if r.get("trial") is not None}
    chosen = [t for t in study.trials if t.user_attrs.get("ds_optuna:enqueued")]
    chosen += [study.trials[int(results.best_trial)]] if "best_trial" in results else []
    for t in chosen:
        name = "best found" if t.number == results.get("best_trial") else f"warm start (trial {t.number})"
        rows.append({"config": name, "trial": t.number, "values": {k: t.params.get(k) for k in SEARCHED},
                     "eval_accuracy": t.value, "refit": by_trial.get(t.number)})

    def test_cell(r) -> str:
        if r is None:
            return "-"
        if r.state != "COMPLETE" or "test_accuracy" not in r.metrics:
            return r.state
        return f"{r.metrics.test_accuracy:.4f}"

    def number(v) -> str:
        return "-" if v is None else f"{v:.3g}"

    print()
    print(f"Search of {args.budget} s on {args.nproc} ranks (n_jobs={args.n_jobs}): {len(study.trials)} trials, "
          f"states {dict(results.states)}; with the refit {wall:.0f} s in all")
    print(f"Sweep dir: {sweep_path}")
    print()
    header = ["config", "trial", "lr", "warmup", "weight decay", "eval acc (search)", "test acc (refit)"]
    table = [header] + [
        [row["config"], "-" if row["trial"] is None else str(row["trial"]),
         *(number(row["values"][k]) for k in SEARCHED), "-" if row["eval_accuracy"] is None else f"{row['eval_accuracy']:.4f}", test_cell(row["refit"])]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = []
    for i, r in enumerate(table):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print("\n".join(lines))
    print()
    for row in rows:
        r = row.pop("refit")
        row["refit"] = {"state": str(r.state), "metrics": _plain(r.get("metrics"))} if r is not None else None
    out = results_folder(args.results, sweep_path)
    if out is not None:
        _save(out, lines, timings=_timings(study, wall, children, load_before), args=args, rows=rows)
    print("eval acc: the search's objective (last evaluation on the eval slice, training on the train slice);")
    print("test acc: the refit (data.stage=final: train + eval, then the held-out test rows, scored once).")
    if "best_trial" in results:
        print(f"rerun the best config: {results.rerun_command}")
        best_refit = by_trial.get(int(results.best_trial))
        if best_refit is not None:
            print(f"rerun its refit:       {best_refit.rerun_command}")
    print(f"search this study for another {args.budget} s (then the refit again): "
          f"make demo ARGS='hydra.sweep.dir={sweep_path}'")
    print(f"plots: {sweep_path / 'plots'}")
    if mlflow_store:
        print(f"MLflow (a run per trial, with the Trainer's curves): mlflow ui --backend-store-uri {mlflow_store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
