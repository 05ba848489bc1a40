"""ds_optuna vs Ray Tune 2.x (``Tuner`` + ``TorchTrainer``, ``OptunaSearch``, ASHA) on the same task and trials.

The task is ``examples/ddp_mlp.py``'s MLP on digits (``bench/vs_ray/digits.py``: 12 epochs, validation
accuracy after each), the same space (lr log [1e-4, 1e-1], 1-4 layers, 4-128 units log), the same number of
trials and TPE (seed 0, 4 random start-up trials), each tool with its own early stopping (ours: Optuna's
successive halving, min_resource 1, reduction factor 4; Ray: ASHA, grace period 1, reduction factor 4), in
two shapes on these 2 cores:

- ``2x1``: trials of 2 ranks, one at a time (``torchrun --nproc-per-node 2 bench/vs_ray/ours.py -m`` /
  ``ray_tune.py --workers 2 --concurrent 1``);
- ``1x2``: trials of 1 rank, two at a time (``hydra.sweeper.n_jobs=2`` / ``max_concurrent_trials=2``).

Each arm is the whole command, start-up included. Where the time goes comes from the task's own timing
lines (``digits.py``: rank 0's seconds of training and of each report) and the wall time: "other s a trial"
is ``(wall x trials at once - training - reports) / trials``, what each trial costs outside its training
loop (starting and stopping its processes or worker group, composing its config, the sampler, storage).
"Lines changed" counts the code lines (no blank lines, comments or docstrings) each tool's script differs
from ``bench/vs_ray/plain.py``, its config file included.

    pip install 'ray[default,tune,train]==2.60.0'   # the benchmark's own extra, never the core's
    python bench/vs_ray_tune.py [--trials 12] [--shapes 2x1 1x2] [--tools ours ray]

Writes ``bench/results/vs_ray_tune.md`` and ``.json``.
"""

import argparse
import ast
import difflib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, markdown_table, median, save, torchrun  # noqa: E402

HERE = REPO / "bench" / "vs_ray"
SHAPES = {"2x1": (2, 1), "1x2": (1, 2)}  # ranks per trial, trials at once
TIMEOUT_S = 1800


def code_lines(path: Path) -> list[str]:
    """The code lines of a Python or YAML file: no blank lines, comments or (Python) docstrings."""
    text = path.read_text()
    if path.suffix == ".py":
        tree = ast.parse(text)
        doc_lines = set()
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                doc_lines.update(range(body[0].lineno, body[0].end_lineno + 1))
        lines = [ln for i, ln in enumerate(text.splitlines(), 1) if i not in doc_lines]
    else:
        lines = text.splitlines()
    return [ln.split(" #")[0].rstrip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def lines_changed(files: list[Path]) -> int:
    """Lines added or removed going from plain.py to ``files`` (the first one is compared line by line with
    plain.py, the others count whole)."""
    diff = difflib.unified_diff(code_lines(HERE / "plain.py"), code_lines(files[0]), lineterm="", n=0)
    changed = sum(1 for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---")))
    return changed + sum(len(code_lines(f)) for f in files[1:])


def timing(path: Path) -> dict:
    """Sum rank 0's per-epoch lines of digits.py: epochs, training s, report s."""
    rows = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    return {"epochs": len(rows), "train_s": sum(r["train_s"] for r in rows),
            "report_s": sum(r["report_s"] for r in rows)}


def run_ours(shape: str, trials: int, tmp: Path) -> dict:
    ranks, at_once = SHAPES[shape]
    sweep, log = tmp / f"ours_{shape}", tmp / f"ours_{shape}.jsonl"
    t0 = time.monotonic()
    rc = torchrun(2, "bench/vs_ray/ours.py",
                  ["-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.n_jobs={at_once}",
                   "hydra.sweeper.plots=false", f"timing_log={log}"],
                  timeout_s=TIMEOUT_S, log_path=tmp / f"ours_{shape}.log")
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"ours {shape} failed ({rc}); see {tmp}/ours_{shape}.log")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    study = optuna.load_study(study_name=results["study_name"], storage=f"sqlite:///{sweep}/optuna.db")
    states = [t.state.name for t in study.trials]
    trial_s = [t.duration.total_seconds() for t in study.trials if t.duration]
    return {"wall_s": wall, "trials": len(study.trials), "best": results["best_value"],
            "complete": states.count("COMPLETE"), "stopped": states.count("PRUNED"), "failed": states.count("FAIL"),
            "trial_s": trial_s, "ranks": ranks, "at_once": at_once, **timing(log)}


def run_ray(shape: str, trials: int, tmp: Path) -> dict:
    ranks, at_once = SHAPES[shape]
    log, summary = tmp / f"ray_{shape}.jsonl", tmp / f"ray_{shape}.json"
    cmd = [sys.executable, str(HERE / "ray_tune.py"), "--trials", str(trials), "--workers", str(ranks),
           "--concurrent", str(at_once), "--timing-log", str(log), "--storage", str(tmp / f"ray_{shape}"),
           "--summary", str(summary)]
    t0 = time.monotonic()
    with open(tmp / f"ray_{shape}.log", "w") as out:
        rc = subprocess.run(cmd, cwd=HERE, env=env(), stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT_S).returncode
    wall = time.monotonic() - t0
    if rc != 0 or not summary.exists():
        raise SystemExit(f"ray {shape} failed ({rc}); see {tmp}/ray_{shape}.log")
    s = json.loads(summary.read_text())
    done = [t for t in s["trials"] if t["error"] is None]
    return {"wall_s": wall, "trials": len(s["trials"]), "best": s["best_acc"],
            "complete": sum(1 for t in done if t["epochs"] == 12), "stopped": sum(1 for t in done if t["epochs"] != 12),
            "failed": len(s["trials"]) - len(done), "trial_s": [t["time_total_s"] for t in s["trials"] if t["time_total_s"]],
            "ranks": ranks, "at_once": at_once, **timing(log)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--tools", nargs="+", default=["ours", "ray"], choices=["ours", "ray"])
    args = ap.parse_args()
    runners = {"ours": run_ours, "ray": run_ray}
    names = {"ours": "ds_optuna (successive halving)", "ray": "Ray Tune + TorchTrainer (ASHA)"}
    changed = {"ours": lines_changed([HERE / "ours.py", HERE / "conf" / "ours.yaml"]),
               "ray": lines_changed([HERE / "ray_tune.py"])}
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-vs-ray-") as tmp:
        for shape in args.shapes:
            for tool in args.tools:
                r = runners[tool](shape, args.trials, Path(tmp))
                r.update(tool=tool, shape=shape)
                runs.append(r)
                print({k: v for k, v in r.items() if k != "trial_s"}, flush=True)
    rows = []
    for r in runs:
        other = (r["wall_s"] * r["at_once"] - r["train_s"] - r["report_s"]) / r["trials"]
        r["other_s_per_trial"] = other
        rows.append([names[r["tool"]], f"{r['ranks']} rank(s) x {r['at_once']} at once", r["trials"],
                     f"{r['complete']} / {r['stopped']} / {r['failed']}", r["epochs"], f"{r['wall_s']:.1f}",
                     f"{r['trials'] * 3600 / r['wall_s']:.0f}", f"{r['train_s']:.1f}", f"{r['report_s']:.1f}",
                     f"{other:.1f}", f"{median(r['trial_s']):.1f}", f"{r['best']:.4f}", changed[r["tool"]]])
    table = markdown_table(["tool", "shape", "trials", "complete / stopped / failed", "epochs trained", "wall s",
                            "trials per hour", "training s", "report s", "other s a trial",
                            "median trial s (tool's clock)", "best val acc", "lines changed"], rows)
    ratios = []
    for shape in args.shapes:
        by = {r["tool"]: r for r in runs if r["shape"] == shape}
        if len(by) == 2:
            ratio = (by["ours"]["trials"] / by["ours"]["wall_s"]) / (by["ray"]["trials"] / by["ray"]["wall_s"])
            ratios.append(f"{shape}: ds_optuna **{ratio:.2f}x** Ray Tune's trials per hour, best "
                          f"{by['ours']['best']:.4f} vs {by['ray']['best']:.4f}")
    md = "\n\n".join([table, "\n".join(f"- {x}" for x in ratios)])
    command = "python bench/vs_ray_tune.py " + " ".join(
        ["--trials", str(args.trials), "--shapes", *args.shapes, "--tools", *args.tools])
    import ray

    save("vs_ray_tune", md, {"trials": args.trials, "ray": ray.__version__, "runs": runs, "lines_changed": changed},
         command)


if __name__ == "__main__":
    main()
