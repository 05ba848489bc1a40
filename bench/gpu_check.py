"""The GPU check (issue 16): the main job on NCCL with DeepSpeed's fused Adam and bf16, peak GPU memory
per trial, and the sweeper's overhead on GPUs; tables under ``bench/results/gpu/``.

Run through ``bench/gpu_check.sh`` (it installs what is missing first). Steps, each with its own time limit:

1. environment: torch, CUDA, NCCL, DeepSpeed, transformers versions, GPU names;
2. the main job (``examples/train.py -m``) on every GPU (NCCL), ZeRO-2 with DeepSpeed's FusedAdam
   (``torch_adam: false``) and bf16, 3 trials; then ZeRO-3 for 2 trials. Batch size and gradient
   accumulation are pinned (only learning rate, warmup and weight decay are searched), so the trials'
   peak GPU memory (rank 0's ``gpu_peak_allocated_bytes``, recorded by ``trial_scope``) must be flat:
   every trial of a stage within 5% of that stage's first trial;
3. trial groups (``hydra.sweeper.n_jobs``, issue 23): ``bench/trial_groups.py --tasks train --arms a b --gpu``,
   4 trials per arm: (a) one trial at a time on the launch's GPUs vs (b) the same launch split into trial
   groups. The layout follows the GPU count: 4 groups of 2 GPUs on 8 (groups of 2 on any even count from 4),
   2 (or 3) groups of 1 GPU on 2 (or 3), and on one GPU 2 single-rank groups sharing it, against (a) on 1
   rank (NCCL refuses two ranks of one group on one device). Trials per hour of both and their ratio go to
   ``<out>/trial_groups.md``; passed when both arms ran every trial to COMPLETE and (b)'s trials came from
   every group. Killed after 300 s;
4. ``bench/overhead.py`` at 1 rank, and at 2 when the machine has two GPUs.

    python bench/gpu_check.py [--out bench/results/gpu] [--allow-cpu] [--steps main trial_groups overhead]

``--steps trial_groups`` runs step 3 alone (with step 1), for a lease too short for the whole check.

``--allow-cpu`` runs the same steps on CPU/gloo without bf16 and fused Adam (a dry run of this script
itself; its numbers say nothing about GPUs). Exit status 0 when every step passed, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, markdown_table  # noqa: E402

FLAT_LIMIT = 0.05  # 5%: the memory promise (case C14), now in GPU bytes


def environment() -> dict:
    """Versions and devices, read in a child process (so this script needs no torch itself)."""
    code = (
        "import json, torch\n"
        "out = {'torch': torch.__version__, 'cuda': torch.version.cuda, 'gpus': [torch.cuda.get_device_name(i) "
        "for i in range(torch.cuda.device_count())]}\n"
        "try:\n    out['nccl'] = '.'.join(map(str, torch.cuda.nccl.version()))\nexcept Exception as e:\n"
        "    out['nccl'] = f'n/a ({type(e).__name__})'\n"
        "for m in ('deepspeed', 'transformers', 'accelerate', 'optuna', 'hydra'):\n"
        "    try:\n        out[m] = __import__(m).__version__\n    except Exception as e:\n"
        "        out[m] = f'missing ({type(e).__name__})'\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"cannot read the environment:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_main_job(name: str, stage: int, trials: int, nproc: int, gpu: bool, workdir: Path, timeout_s: float) -> dict:
    """One sweep of the main job; returns its trials (state, value, seconds, GPU peak) and wall seconds."""
    import optuna

    sweep = workdir / name
    args = [
        "-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.study_name={name}", f"hydra.sweeper.n_trials={trials}",
        f"deepspeed=zero{stage}", "hydra.sweeper.enqueue_trials=null", "hydra.sweeper.rank_timeout=300",
        # pinned: the peak memory of a trial must not depend on what was sampled
        "training.per_device_train_batch_size=16", "training.gradient_accumulation_steps=1",
        *(["data.train_size=1024", "data.eval_size=256"] if gpu else ["data.train_size=128", "data.eval_size=64"]),
    ]
    if gpu:
        args += ["training.bf16=true", "deepspeed.optimizer.params.torch_adam=false"]
    env = dict(os.environ, OMP_NUM_THREADS="4", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(REPO / "examples" / "train.py"), *args]
    log = workdir / f"{name}.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun's group; its ranks follow when it dies
            proc.wait()
            rc = -9
            f.write(f"\n[gpu_check] killed after {timeout_s} s\n")
    wall = time.monotonic() - t0
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{sweep}/optuna.db")
    rows = []
    for t in study.trials:
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete else None
        rows.append({"number": t.number, "state": t.state.name, "value": t.value, "seconds": seconds,
                     "gpu_peak_bytes": t.user_attrs.get("gpu_peak_allocated_bytes")})
    shown = ["python", *(os.path.relpath(c, REPO) if c.startswith(str(REPO)) else c for c in cmd[1:])]
    return {"name": name, "stage": stage, "rc": rc, "wall_s": wall, "trials": rows, "log": str(log),
            "command": " ".join(shown)}


def run_overhead(ranks: int, out: Path, gpu: bool, trials: int = 20, timeout_s: float = 240) -> int:
    """``bench/overhead.py`` at ``ranks`` ranks (sqlite storage), its table written under ``out`` only.

    The table goes to ``<out>/overhead_<ranks>rank.md``/``.json`` and the printed output to ``.txt`` beside it;
    ``bench/results/overhead.*`` (the CPU figures docs/performance.md cites) are never touched, which
    ``tests/test_bench_results.py`` checks. Returns overhead.py's exit status; raises
    ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds.
    """
    out = Path(out).resolve()
    shown = os.path.relpath(out, REPO) if out.is_relative_to(REPO) else str(out)
    cuda = ",".join(str(i) for i in range(ranks)) if gpu else ""
    proc = subprocess.run([sys.executable, "bench/overhead.py", "--trials", str(trials), "--ranks", str(ranks),
                           "--storage", "sqlite", "--out", shown, "--name", f"overhead_{ranks}rank"], cwd=REPO,
                          env=dict(os.environ, BENCH_CUDA_VISIBLE_DEVICES=cuda), capture_output=True, text=True,
                          timeout=timeout_s)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"overhead_{ranks}rank.txt").write_text(proc.stdout + proc.stderr[-3000:])
    return proc.returncode


def trial_group_layout(n_gpus: int, gpu: bool) -> dict:
    """World and ``n_jobs`` of the trial-groups step for this machine (module docstring, step 3)."""
    if n_gpus >= 4 and n_gpus % 2 == 0:
        return {"nproc": n_gpus, "n_jobs": n_gpus // 2, "a_nproc": n_gpus}
    if n_gpus >= 2:
        return {"nproc": n_gpus, "n_jobs": n_gpus, "a_nproc": n_gpus}
    return {"nproc": 2, "n_jobs": 2, "a_nproc": 1 if gpu else 2}  # one GPU shared by 2 groups; CPU dry run: 2 ranks


def run_trial_groups(n_gpus: int, out: Path, gpu: bool, trials: int = 4, timeout_s: float = 300) -> dict:
    """``bench/trial_groups.py`` in its GPU form, its tables written under ``out`` only; returns what it found.

    Raises ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds."""
    out = Path(out).resolve()
    shown = os.path.relpath(out, REPO) if out.is_relative_to(REPO) else str(out)
    layout = trial_group_layout(n_gpus, gpu)
    cmd = [sys.executable, "bench/trial_groups.py", "--tasks", "train", "--arms", "a", "b", "--trials", str(trials),
           "--repeat", "1", "--attempts", "1", "--wait-quiet", "0", "--nproc", str(layout["nproc"]),
           "--n-jobs", str(layout["n_jobs"]), "--a-nproc", str(layout["a_nproc"]), "--out", shown,
           # each of the two runs killed (its whole process group) by trial_groups.py itself, before this limit
           "--timeout", str((timeout_s - 30) / 2)] + (["--gpu"] if gpu else [])
    cuda = ",".join(str(i) for i in range(n_gpus)) if gpu else ""
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, BENCH_CUDA_VISIBLE_DEVICES=cuda), capture_output=True,
                          text=True, timeout=timeout_s)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trial_groups.txt").write_text(proc.stdout + proc.stderr[-3000:])
    found = {**layout, "rc": proc.returncode, "passed": False}
    result = out / "trial_groups.json"
    if proc.returncode == 0 and result.exists():
        data = json.loads(result.read_text())
        runs = {r["arm"]: r for r in data["runs"]}
        found["b_over_a"] = data["summary"]["train"].get("b_over_a")
        found["trials_per_hour"] = {arm: r["trials_per_hour"] for arm, r in runs.items()}
        found["passed"] = (all(r["states"] == {"COMPLETE": trials} for r in runs.values())
                           and len(runs["b"]["trials_per_group"]) == layout["n_jobs"])
    return found


def flat(rows: list[dict]) -> tuple[bool, str]:
    """Every trial's peak within :data:`FLAT_LIMIT` of the first trial's."""
    peaks = [r["gpu_peak_bytes"] for r in rows]
    if not peaks or any(p is None for p in peaks):
        return False, f"peaks missing: {peaks}"
    worst = max(abs(p - peaks[0]) / peaks[0] for p in peaks)
    return worst <= FLAT_LIMIT, f"max deviation from trial 0: {100 * worst:.2f}% (limit {100 * FLAT_LIMIT:.0f}%)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu")
    ap.add_argument("--allow-cpu", action="store_true", help="dry run on CPU/gloo (no bf16, no fused Adam)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dso_gpu_check"))
    ap.add_argument("--steps", nargs="+", default=["main", "trial_groups", "overhead"],
                    choices=["main", "trial_groups", "overhead"], help="steps 2, 3, 4 (step 1 always runs)")
    args = ap.parse_args()
    t_start = time.monotonic()
    env_info = environment()
    print("environment:", json.dumps(env_info, indent=1))
    n_gpus = len(env_info["gpus"])
    gpu = n_gpus > 0
    if not gpu and not args.allow_cpu:
        print("no CUDA device found; this check is for a GPU machine (--allow-cpu runs it on CPU as a dry run)")
        return 1
    nproc = max(n_gpus, 1) if gpu else 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    runs = []
    for name, stage, trials, limit in (("zero2", 2, 3, 240), ("zero3", 3, 2, 180)) if "main" in args.steps else ():
        run = run_main_job(name, stage, trials, nproc, gpu, args.workdir, limit)
        good_states = run["rc"] == 0 and all(r["state"] in ("COMPLETE", "PRUNED") for r in run["trials"])
        is_flat, why = flat(run["trials"]) if gpu else (True, "CPU dry run: no GPU memory")
        run.update(passed=good_states and is_flat, flat=why)
        ok &= run["passed"]
        runs.append(run)
        print(f"{name}: exit {run['rc']}, {run['wall_s']:.0f} s, {why}")
    groups = None
    if "trial_groups" in args.steps:
        try:
            groups = run_trial_groups(n_gpus, args.out, gpu)
        except subprocess.TimeoutExpired as e:
            groups = {"rc": None, "passed": False, "error": f"killed after {e.timeout} s"}
        ok &= groups["passed"]
        print(f"trial groups: {json.dumps(groups)}")
    overhead_rc = {}
    for ranks in ([1, 2] if n_gpus >= 2 else [1]) if "overhead" in args.steps else []:
        overhead_rc[ranks] = run_overhead(ranks, args.out, gpu)
        ok &= overhead_rc[ranks] == 0
    rows = [[r["name"], r["stage"], t["number"], t["state"], f"{t['value']:.4f}" if t["value"] is not None else "-",
             f"{t['seconds']:.1f}" if t["seconds"] else "-",
             f"{t['gpu_peak_bytes'] / 2**20:.0f}" if t["gpu_peak_bytes"] else "-"] for r in runs for t in r["trials"]]
    table = markdown_table(["run", "ZeRO", "trial", "state", "eval acc", "seconds", "GPU peak MiB"], rows)
    summary = "\n".join(f"- {r['name']}: exit {r['rc']}, {r['wall_s']:.0f} s, {r['flat']}" for r in runs)
    shown_command = "bash bench/gpu_check.sh" + (" --allow-cpu" if args.allow_cpu else "") + (
        f" --steps {' '.join(args.steps)}" if args.steps != ap.get_default("steps") else "")
    md = (f"# GPU check ({'GPU' if gpu else 'CPU dry run'})\n\nEnvironment: `{json.dumps(env_info)}`\n\n{table}\n\n"
          f"{summary}\n- trial groups (trial_groups.md): {json.dumps(groups) if groups else 'not run'}\n"
          f"- overhead.py exit codes by ranks: {overhead_rc} (tables in overhead_*rank.md)\n"
          f"- total {time.monotonic() - t_start:.0f} s; {'PASSED' if ok else 'FAILED'}\n\n"
          f"Command: `{shown_command}`\n")
    (args.out / "gpu_check.md").write_text(md)
    (args.out / "gpu_check.json").write_text(json.dumps({"environment": env_info, "runs": runs, "overhead_rc": overhead_rc,
                                                         "trial_groups": groups, "passed": ok}, indent=1, default=str))
    print(md)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
