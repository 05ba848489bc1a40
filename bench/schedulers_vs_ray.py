"""Schedulers vs Ray Tune's (issue 41): our promotion ASHA and PBT against Ray Tune's ASHA and PBT, same task.

The task is ``bench/vs_ray``'s digits MLP (``bench/vs_ray/digits.py``: examples/ddp_mlp.py's model and data, one
width for every layer; 12 epochs; validation accuracy after each, reported at step = epochs done; lr log
[1e-4, 1e-1], 1-4 layers, 4-128 units log), 2 ranks a trial, one trial at a time, in both tools:

- ``ours_asha``: ``torchrun --nproc-per-node 2 bench/vs_ray/ours_sched.py -m hydra/sweeper/scheduler=asha``
  with min_steps 1, max_steps 12, reduction factor 3 (rungs after 1, 3 and 9 epochs; a paused trial is
  continued from its checkpoint when promoted); TPE with the seed, 4 random start-up trials.
- ``ray_asha``: ``bench/vs_ray/ray_sched.py --scheduler asha``: Ray Tune + Ray Train ``TorchTrainer`` (2 workers),
  ``OptunaSearch`` (the same TPE, seed and start-up) and ``ASHAScheduler`` grace period 1, reduction factor 3,
  max_t 12 (the same rungs; Ray stops trials), ``max_concurrent_trials=1``.
- ``ours_pbt``: ``hydra/sweeper/scheduler=pbt`` with interval 3, max_steps 12, ``mutations=[params.lr]``, quantile
  0.25, resample probability 0.25, factors 0.8 / 1.2; the members' first configurations from the random sampler
  (with the seed), as Ray's PBT takes no search algorithm.
- ``ray_pbt``: ``ray_sched.py --scheduler pbt``: ``PopulationBasedTraining`` with the same interval (epochs),
  quantile, resample probability, factors and lr distribution (clipped to its range as ours), the same
  population starting from the same first configurations (ours' members', given as ``points_to_evaluate``), so
  the two differ only in their PBT; weights and optimizer state through Ray Train checkpoints (see
  ``ray_sched.py``); one member training at a time, the others paused.

Per seed, the arms run in the order ours_asha, ray_asha, ours_pbt, ray_pbt (ours then Ray, so both see the same
load). Each arm is the whole command, start-up included. Figures: configurations (ASHA) or members (PBT), trials
(Optuna trials, an ASHA promotion or a PBT interval being one more; Tune trials), epochs trained (rank 0's timing
lines of ``digits.py``: one per epoch trained, in both tools), wall seconds, configurations or members per hour,
best value (the best validation accuracy of a trial that trained to epoch 12: COMPLETE in Optuna, 12 epochs
reported in Tune).

Target (issue 41): ours at least 1.5x Ray Tune's configurations (ASHA) or members (PBT) per hour, at the same or
better best value, per scheduler and seed.

Equal compute for ASHA: Ray's ASHA continues every trial that is in the top third of its rung when it gets there,
so with the same configurations it trains more epochs than ours, which pauses them (at 12 configurations, 66-77
against 39-43: bench/results/schedulers_vs_ray*.md of stop 53). Ours is therefore given ``--ours-configs``
configurations and judged within Ray's epochs (``bench/schedulers.py``'s ``within_budget``: its trials in the
order they finished, each one's own reported epochs counted up): its best value there, and its configurations
per hour up to there (the configurations finished within those epochs over the time from the command's start to
the last of them). Its whole run is in the first table.

    python bench/schedulers_vs_ray.py [--seeds 0 1 2] [--configs 12] [--ours-configs 24] [--population 8] \\
        --ray-python <venv>/bin/python

Ray Tune 2.60 (``pip install 'ray[default,tune,train]==2.60.0'``) goes in its own virtual environment, given as
``--ray-python`` (with the same torch, optuna, numpy and scikit-learn versions); ours runs with this Python.
Writes ``bench/results/schedulers_vs_ray.md`` and ``.json`` (``--name``: another stem).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, markdown_table, save, torchrun  # noqa: E402
from schedulers import read_study, within_budget  # noqa: E402

HERE = REPO / "bench" / "vs_ray"
EPOCHS = 12
TARGET = 1.5
TIMEOUT_S = 1800
OURS = {
    "asha": ["hydra.sweeper.sampler.n_startup_trials=4", "hydra/sweeper/scheduler=asha", "hydra.sweeper.scheduler.min_steps=1",
             f"hydra.sweeper.scheduler.max_steps={EPOCHS}", "hydra.sweeper.scheduler.reduction_factor=3"],
    "pbt": ["hydra/sweeper/sampler=random", "hydra/sweeper/scheduler=pbt",
            "hydra.sweeper.scheduler.interval=3", f"hydra.sweeper.scheduler.max_steps={EPOCHS}",
            "hydra.sweeper.scheduler.mutations=[params.lr]"],
}


def epochs_trained(path: Path) -> int:
    """Rank 0's timing lines of digits.py: one per epoch trained."""
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_ours(sched: str, seed: int, n: int, tmp: Path) -> dict:
    name = f"ours_{sched}_seed{seed}"
    sweep, timing = tmp / name, tmp / f"{name}.jsonl"
    args = ["-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={n}", f"hydra.sweeper.sampler.seed={seed}",
            "hydra.sweeper.plots=false", f"timing_log={timing}", *OURS[sched]]
    t0, started = time.monotonic(), time.time()
    rc = torchrun(2, "bench/vs_ray/ours_sched.py", args, timeout_s=TIMEOUT_S, log_path=tmp / f"{name}.log")
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"{name} failed ({rc}); log:\n" + (tmp / f"{name}.log").read_text()[-4000:])
    s = read_study(f"sqlite:///{sweep}/optuna.db", study_name="ours")
    exploits = sum(1 for t in s["per_trial"] if t["continues"] is not None) if sched == "pbt" else None
    log = (tmp / f"{name}.log").read_text()
    first = [{k.split(".", 1)[1]: v for k, v in t["params"].items()} for t in s["per_trial"] if t["continues"] is None]
    return {"exploits": log.count("PBT: member of trial") if sched == "pbt" else None, "continuations": exploits,
            "first_configurations": first,
            "configurations": s["configurations"], "trials": s["trials"], "epochs": epochs_trained(timing),
            "epochs_reported": s["epochs"], "wall_s": wall, "best": s["best"], "states": s["states"],
            "started": started, "study": s}


def run_ray(sched: str, seed: int, n: int, tmp: Path, python: str, initial: list[dict] | None = None) -> dict:
    name = f"ray_{sched}_seed{seed}"
    timing, summary = tmp / f"{name}.jsonl", tmp / f"{name}.json"
    cmd = [python, str(HERE / "ray_sched.py"), "--scheduler", sched, "--trials", str(n), "--seed", str(seed),
           "--workers", "2", "--epochs", str(EPOCHS), "--timing-log", str(timing), "--storage", str(tmp / name),
           "--summary", str(summary)]
    if initial:
        (tmp / f"{name}_initial.json").write_text(json.dumps(initial))
        cmd += ["--initial", str(tmp / f"{name}_initial.json")]
    t0 = time.monotonic()
    with open(tmp / f"{name}.log", "w") as out:
        rc = subprocess.run(cmd, cwd=HERE, env=env(), stdout=out, stderr=subprocess.STDOUT,
                            timeout=TIMEOUT_S).returncode
    wall = time.monotonic() - t0
    if rc != 0 or not summary.exists():
        raise SystemExit(f"{name} failed ({rc}); log:\n" + (tmp / f"{name}.log").read_text()[-4000:])
    s = json.loads(summary.read_text())
    states = {"complete": sum(1 for t in s["trials"] if t["epochs"] == EPOCHS),
              "stopped": sum(1 for t in s["trials"] if t["error"] is None and t["epochs"] != EPOCHS),
              "failed": sum(1 for t in s["trials"] if t["error"] is not None)}
    exploits = (tmp / f"{name}.log").read_text().count("[Exploit]")  # PBT's clones ("[Exploit] Cloning trial ...")
    return {"configurations": len(s["trials"]), "trials": len(s["trials"]), "epochs": epochs_trained(timing),
            "wall_s": wall, "best": s["best"], "states": {k: v for k, v in states.items() if v},
            "exploits": exploits, "per_trial": s["trials"]}


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--configs", type=int, default=12, help="ASHA: configurations (n_trials / num_samples)")
    ap.add_argument("--ours-configs", type=int, default=None,
                    help="ASHA: our configurations (n_trials), judged within Ray's epochs (default: --configs)")
    ap.add_argument("--population", type=int, default=8, help="PBT: members, in both tools")
    ap.add_argument("--schedulers", nargs="+", default=["asha", "pbt"], choices=["asha", "pbt"])
    ap.add_argument("--ray-python", required=True, help="the Python of a virtual environment with Ray Tune 2.60")
    ap.add_argument("--name", default="schedulers_vs_ray", help="result file stem under bench/results/ (a run of "
                    "other seeds can keep its own file)")
    args = ap.parse_args()
    ray_version = subprocess.run([args.ray_python, "-c", "import ray, sys; print(ray.__version__, sys.version.split()[0])"],
                                 capture_output=True, text=True, check=True).stdout.split()
    ours_n = {"asha": args.ours_configs or args.configs, "pbt": args.population}
    n = {"asha": args.configs, "pbt": args.population}
    rows, cmp_rows, data = [], [], {"configs": args.configs, "population": args.population, "ray": ray_version[0],
                                    "ray_python": ray_version[1], "seeds": {}}
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-sched-vs-ray-") as tmp:
        for seed in args.seeds:
            entry = data["seeds"][str(seed)] = {}
            for sched in args.schedulers:
                res = {}
                for tool in ("ours", "ray"):
                    load = os.getloadavg()[0]
                    r = run_ours(sched, seed, ours_n[sched], Path(tmp)) if tool == "ours" else \
                        run_ray(sched, seed, n[sched], Path(tmp), args.ray_python,
                                res["ours"]["first_configurations"] if sched == "pbt" else None)
                    r["load_1min_before"] = load
                    res[tool] = entry[f"{tool}_{sched}"] = r
                    rows.append([seed, f"{tool}_{sched}", r["configurations"], r["trials"], r["epochs"],
                                 f"{r['wall_s']:.0f}", f"{r['configurations'] * 3600 / r['wall_s']:.0f}",
                                 _fmt(r["best"], ".4f"), " ".join(f"{k}:{v}" for k, v in sorted(r["states"].items())),
                                 f"{load:.1f}"])
                    print(rows[-1], flush=True)
                o, y = res["ours"], res["ray"]
                if sched == "asha":  # ours judged within Ray's epochs (the module docstring)
                    b = within_budget(o.pop("study"), y["epochs"])
                    o = entry["ours_asha_within_ray_epochs"] = {
                        **b, "wall_s": b["finished"] - o["started"] if b["finished"] else float("inf")}
                    rows.append([seed, "ours_asha within Ray's epochs", b["configurations"], b["trials"], b["epochs"],
                                 f"{o['wall_s']:.0f}", f"{b['configurations'] * 3600 / o['wall_s']:.0f}",
                                 _fmt(b["best"], ".4f"), "-", "-"])
                else:
                    o.pop("study")
                ratio = (o["configurations"] / o["wall_s"]) / (y["configurations"] / y["wall_s"])
                value_ok = o["best"] is not None and (y["best"] is None or o["best"] >= y["best"])
                met = ratio >= TARGET and value_ok
                entry[f"verdict_{sched}"] = {"ratio": ratio, "ours_best": o["best"], "ray_best": y["best"],
                                             "value_same_or_better": value_ok, "met": met}
                why = "" if met else (" (" + "; ".join(
                    ([f"rate {ratio:.2f}x < {TARGET}x"] if ratio < TARGET else [])
                    + ([f"best {_fmt(o['best'], '.4f')} below Ray's {_fmt(y['best'], '.4f')}"] if not value_ok else []))
                    + ")")
                cmp_rows.append([seed, sched, f"{ratio:.1f}x", _fmt(o["best"], ".4f"), _fmt(y["best"], ".4f"),
                                 "met" if met else f"**missed**{why}"])
    minutes = (time.monotonic() - t_all) / 60
    data["minutes"] = minutes
    table = markdown_table(["seed", "arm", "configurations / members", "trials", "epochs trained", "wall s",
                            "configurations / members per hour", "best value", "states", "load (1 min) before"], rows)
    cmp = markdown_table(["seed", "scheduler", "ours / Ray per hour", "ours best", "Ray best",
                          f"target ({TARGET}x, same or better best)"], cmp_rows)
    met = sum(1 for r in cmp_rows if r[-1] == "met")
    md = "\n\n".join([
        table, cmp, f"Target (ours at least {TARGET}x Ray Tune's configurations or members per hour at the same or "
        f"better best value): met in {met} of {len(cmp_rows)} comparisons.",
        f"Settings: `bench/vs_ray/digits.py` ({EPOCHS} epochs), 2 ranks a trial, one trial at a time; ASHA "
        f"{args.configs} configurations in Ray Tune, {ours_n['asha']} in ours, judged within Ray's epochs (rungs after "
        "1, 3, 9 epochs; TPE, 4 start-up trials, the seed), PBT "
        f"{args.population} members (interval 3 epochs, quantile 0.25, resample probability 0.25, lr mutated; random "
        f"first configurations, the seed, the same in both tools: Ray's are ours'). Ray Tune {ray_version[0]} (Python {ray_version[1]}, its own virtual "
        "environment with the same torch, optuna, numpy and scikit-learn), Ray Train V2 TorchTrainer with 2 "
        f"workers. Whole benchmark: {minutes:.1f} min. Arms interleaved per seed (ours, then Ray); the load column "
        "is the machine's 1-minute load average when the arm started (2 cores shared with other work)."])
    command = "python bench/schedulers_vs_ray.py --seeds " + " ".join(map(str, args.seeds)) + \
        f" --configs {args.configs}" + (f" --ours-configs {args.ours_configs}" if args.ours_configs else "") + \
        f" --population {args.population} --schedulers {' '.join(args.schedulers)}" + \
        " --ray-python <ray venv>/bin/python" + (f" --name {args.name}" if args.name != "schedulers_vs_ray" else "")
    # (the Ray venv's path on the build machine stays out of the results)
    save(args.name, md, data, command)
    out = REPO / "bench" / "results" / f"{args.name}.md"  # the Machine line names Ray's version too
    text = out.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("Machine:"))
    out.write_text(text.replace(line, f"{line}; ray {ray_version[0]} (Python {ray_version[1]}, its own venv)"))


if __name__ == "__main__":
    main()
