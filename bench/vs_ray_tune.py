"""ds_optuna vs Ray Tune 2.x (``Tuner`` + ``TorchTrainer``, ``OptunaSearch``, ASHA) on the same tasks and trials.

Two tasks, each with the same space, number of trials and TPE (seed 0, 4 random start-up trials) in both
tools, each tool with its own early stopping:

- ``digits``: ``examples/ddp_mlp.py``'s MLP on digits (``bench/vs_ray/digits.py``: 12 epochs, validation
  accuracy after each; lr log [1e-4, 1e-1], 1-4 layers, 4-128 units log; 12 trials). Ours:
  ``bench/vs_ray/ours.py`` with Optuna's successive halving (min_resource 1, reduction factor 4); Ray:
  ``bench/vs_ray/ray_tune.py`` with ASHA (grace period 1, reduction factor 4). Both scripts start from
  ``bench/vs_ray/plain.py``; "lines changed" counts the code lines (no blank lines, comments or
  docstrings) each differs from it, its config file included.
- ``train``: the main job on ``bench/vs_transformers.py``'s slice (MiniLM, HF Trainer + DeepSpeed ZeRO-2,
  128 train / 64 eval questions, 4 evaluations; conf/train.yaml's space; 6 trials). Ours:
  ``examples/train.py -m`` with its median pruner, no warm start; Ray: ``bench/vs_ray/hf_ray_tune.py``
  (the same Trainer the HF way in each Ray Train worker, ASHA on evaluations, grace period 2, reduction
  factor 2).

Two shapes on these 2 cores: ``2x1``, trials of 2 ranks one at a time (``torchrun --nproc-per-node 2 ... -m``
/ ``--workers 2 --concurrent 1``); ``1x2``, trials of 1 rank two at a time (``hydra.sweeper.n_jobs=2`` /
``max_concurrent_trials=2``). Each arm is the whole command, start-up included. For ``digits``, where the
time goes comes from the task's own timing lines (rank 0's seconds of training and of each report) and
the wall time: "other s a trial" is ``(wall x trials at once - training - reports) / trials``, what a
trial costs outside its training loop (starting and stopping its processes or worker group, its config,
the sampler, storage). "median trial s" is each tool's own clock (Optuna's trial duration, Tune's
``time_total_s``).

    pip install 'ray[default,tune,train]==2.60.0'   # the benchmark's own extra, never the core's
    python bench/vs_ray_tune.py [--tasks digits train] [--trials 12 6] [--shapes 2x1 1x2] [--tools ours ray]

Writes ``bench/results/vs_ray_tune.md`` and ``.json``; about 25 minutes on 2 cores.
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
TASKS = ("digits", "train")
TARGET = 1.5  # issue 26: ours at least 1.5x Ray's trials per hour at equal trials
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


SLICE = ["data.train_size=128", "data.eval_size=64"]  # bench/vs_transformers.py's slice of the main job


def run_ours(task: str, shape: str, trials: int, tmp: Path) -> dict:
    ranks, at_once = SHAPES[shape]
    name = f"ours_{task}_{shape}"
    sweep, log = tmp / name, tmp / f"{name}.jsonl"
    args = ["-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.n_jobs={at_once}",
            "hydra.sweeper.plots=false"]
    if task == "digits":
        script, args = "bench/vs_ray/ours.py", [*args, f"timing_log={log}"]
    else:  # the main job as the README runs it: conf/train.yaml's TPE (seed 0) and median pruner, no warm start
        script, args = "examples/train.py", [*args, "hydra.sweeper.sampler.seed=0", "hydra.sweeper.enqueue_trials=null",
                                             *SLICE]
    t0 = time.monotonic()
    rc = torchrun(2, script, args, timeout_s=TIMEOUT_S, log_path=tmp / f"{name}.log")
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"{name} failed ({rc}); see {tmp}/{name}.log")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    study = optuna.load_study(study_name=results["study_name"], storage=f"sqlite:///{sweep}/optuna.db")
    states = [t.state.name for t in study.trials]
    trial_s = [t.duration.total_seconds() for t in study.trials if t.duration]
    return {"wall_s": wall, "trials": len(study.trials), "best": results["best_value"],
            "complete": states.count("COMPLETE"), "stopped": states.count("PRUNED"), "failed": states.count("FAIL"),
            "trial_s": trial_s, "ranks": ranks, "at_once": at_once, **timing(log)}


def run_ray(task: str, shape: str, trials: int, tmp: Path) -> dict:
    ranks, at_once = SHAPES[shape]
    name = f"ray_{task}_{shape}"
    log, summary = tmp / f"{name}.jsonl", tmp / f"{name}.json"
    script, reports, extra = ("ray_tune.py", 12, []) if task == "digits" else ("hf_ray_tune.py", 4, ["--", *SLICE])
    cmd = [sys.executable, str(HERE / script), "--trials", str(trials), "--workers", str(ranks),
           "--concurrent", str(at_once), "--timing-log", str(log), "--storage", str(tmp / name),
           "--summary", str(summary), *extra]
    t0 = time.monotonic()
    with open(tmp / f"{name}.log", "w") as out:
        rc = subprocess.run(cmd, cwd=HERE, env=env(), stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT_S).returncode
    wall = time.monotonic() - t0
    if rc != 0 or not summary.exists():
        raise SystemExit(f"{name} failed ({rc}); see {tmp}/{name}.log")
    s = json.loads(summary.read_text())
    done = [t for t in s["trials"] if t["error"] is None]
    return {"wall_s": wall, "trials": len(s["trials"]), "best": s["best"],
            "complete": sum(1 for t in done if t["reports"] == reports),
            "stopped": sum(1 for t in done if t["reports"] != reports),
            "failed": len(s["trials"]) - len(done), "trial_s": [t["time_total_s"] for t in s["trials"] if t["time_total_s"]],
            "ranks": ranks, "at_once": at_once, **timing(log)}


def row(r: dict, changed: dict) -> list:
    """One table row; the timing split only for the digits task (its timing lines)."""
    names = {"ours": "ds_optuna", "ray": "Ray Tune + TorchTrainer"}
    split = ["-", "-", "-"]
    if r["task"] == "digits":
        r["other_s_per_trial"] = (r["wall_s"] * r["at_once"] - r["train_s"] - r["report_s"]) / r["trials"]
        split = [f"{r['train_s']:.1f}", f"{r['report_s']:.1f}", f"{r['other_s_per_trial']:.1f}"]
    return [r["task"], names[r["tool"]], f"{r['ranks']} x {r['at_once']}", r["trials"],
            f"{r['complete']} / {r['stopped']} / {r['failed']}", f"{r['wall_s']:.1f}",
            f"{r['trials'] * 3600 / r['wall_s']:.0f}", *split, f"{median(r['trial_s']):.1f}", f"{r['best']:.4f}",
            changed[r["tool"]] if r["task"] == "digits" else "-"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS),
                    help="all (the default) write bench/results/vs_ray_tune.*; a subset vs_ray_tune_<tasks>.*")
    ap.add_argument("--trials", type=int, nargs=2, default=[12, 6], metavar=("DIGITS", "TRAIN"),
                    help="trials per search of each task")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--tools", nargs="+", default=["ours", "ray"], choices=["ours", "ray"])
    args = ap.parse_args()
    runners = {"ours": run_ours, "ray": run_ray}
    changed = {"ours": lines_changed([HERE / "ours.py", HERE / "conf" / "ours.yaml"]),
               "ray": lines_changed([HERE / "ray_tune.py"])}
    trials = dict(zip(TASKS, args.trials))
    runs = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-vs-ray-") as tmp:
        for task in args.tasks:
            for shape in args.shapes:
                for tool in args.tools:
                    r = runners[tool](task, shape, trials[task], Path(tmp))
                    r.update(tool=tool, shape=shape, task=task)
                    runs.append(r)
                    print({k: v for k, v in r.items() if k != "trial_s"}, flush=True)
    table = markdown_table(["task", "tool", "ranks x trials at once", "trials", "complete / stopped / failed",
                            "wall s", "trials per hour", "training s", "report s", "other s a trial",
                            "median trial s (tool's clock)", "best val acc", "lines changed"],
                           [row(r, changed) for r in runs])
    ratios = []
    for task in args.tasks:
        for shape in args.shapes:
            by = {r["tool"]: r for r in runs if r["shape"] == shape and r["task"] == task}
            if len(by) == 2:
                ratio = (by["ours"]["trials"] / by["ours"]["wall_s"]) / (by["ray"]["trials"] / by["ray"]["wall_s"])
                ratios.append(f"{task}, {shape}: ds_optuna **{ratio:.2f}x** Ray Tune's trials per hour (target 1.5x: "
                              f"{'met' if ratio >= TARGET else 'missed'}), best {by['ours']['best']:.4f} vs "
                              f"{by['ray']['best']:.4f}")
    md = "\n\n".join([table, "\n".join(f"- {x}" for x in ratios),
                       f"Whole benchmark: {(time.monotonic() - t_all) / 60:.1f} min."])
    command = "python bench/vs_ray_tune.py " + " ".join(
        ["--tasks", *args.tasks, "--trials", *map(str, args.trials), "--shapes", *args.shapes, "--tools", *args.tools])
    import ray

    # A run of some tasks only keeps its own file, so it never hides the other tasks' committed rows.
    name = "vs_ray_tune" if list(args.tasks) == list(TASKS) else "vs_ray_tune_" + "_".join(args.tasks)
    save(name, md, {"trials": trials, "ray": ray.__version__, "runs": runs, "lines_changed": changed},
         command)


if __name__ == "__main__":
    main()
