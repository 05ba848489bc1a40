"""Trial groups inside one launch (``hydra.sweeper.n_jobs``, issue 23): trials per hour three ways, in one run.

Every arm runs the same task with the same budget (``hydra.sweeper.n_trials``) and sampler seed (0), each on
a fresh sweep dir and a fresh study:

(a) one launch of 2 ranks with ``n_jobs=1``: every trial on both ranks (DDP, or DeepSpeed over 2 ranks);
(b) one launch of 2 ranks with ``n_jobs=2``: two trial groups of 1 rank run trials at once; global rank 0
    owns the study for both (the default SQLite file in the sweep dir);
(c) two ``torchrun --standalone --nproc-per-node 1`` launches started at the same moment on one PostgreSQL
    study (a fresh study name per run, deleted after it): the way to run trials at once before ``n_jobs``
    (docs/how-to/shared-studies.md; ``bench/parallel_groups.py``). Both launches get seed 0 too: the
    second launch to open the study is its run 2 and draws from the seed derived from it (docs/how-to/checkpoints.md, "Resume").

Tasks (``--tasks``):

- ``mlp``, the plain DDP example ``examples/ddp_mlp.py`` with a fixed depth and width (2 hidden layers of
  512 units, as in ``bench/parallel_groups.py``, for 40 epochs), so that every trial does the same work; only
  the learning rate is searched;
- ``train``, the main job ``examples/train.py`` (all-MiniLM-L6-v2 on TREC-6, HF Trainer + DeepSpeed ZeRO-2)
  on the slice ``bench/vs_transformers.py`` uses (``data.train_size=128 data.eval_size=64``), warm starts
  off: a model that fits one device, the common case for trial groups.

The micro batch per rank stays as configured in every arm, so a trial's work (its epochs over the same
train slice) is the same in every arm; at 2 ranks it is split between them. No pruning
(``_common.NO_PRUNING``), no plots.

Measured per run: wall seconds from the launch to the exit of its last process (the whole command, start-up
and exit included; for (c) from the first launch to the last exit), the trials the stored study holds
(COMPLETE ones; (c) can overshoot the budget by one trial, each launch counting the study before it asks),
and trials per hour = trials / wall hours. The arms run interleaved, ``--repeat`` times, in an order rotated
each repeat; the medians over the repeats are compared. Before each run the script waits (at most
``--wait-quiet`` seconds) for other processes to leave the cores idle, and records the cores they kept busy
during the run (``/proc/stat`` less our own CPU time; for (c) this includes the PostgreSQL server); a run
during which they kept more than 0.3 cores busy is measured again (``--attempts``) and the least disturbed
measurement kept (the others stay in the JSON file).

Targets on these 2 cores:

- ``mlp``: (b)/(a) >= 1.5x trials per hour;
- both tasks: (b) within 5% of (c), that is (b)/(c) >= 0.95x trials per hour (faster than (c) is no miss).

    python bench/trial_groups.py --trials 10 --repeat 2    # about 13 minutes on 2 idle cores

Writes ``bench/results/trial_groups.md`` and ``.json`` (``bench/_common.save``). Needs a PostgreSQL server
for (c) (``--storage``, default ``$DSO_TEST_POSTGRES_URL`` or the local test server).

The GPU form is step 3 of ``bench/gpu_check.py`` (``bash bench/gpu_check.sh``): ``--tasks train --arms a b
--gpu`` with the world and ``n_jobs`` chosen from the GPU count (see there), written to ``bench/results/gpu``;
``--a-nproc`` gives (a) its own world size there (1 on a single GPU: NCCL refuses two ranks on one device).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import NO_PRUNING, REPO, RESULTS, env, markdown_table, median, save  # noqa: E402
from parallel_groups import DEFAULT_STORAGE, cpu_busy_s, loadavg, redact, shown_command, wait_until_quiet  # noqa: E402

#: (b)/(a) at least this for the DDP example (``mlp``).
TARGET_B_OVER_A = {"mlp": 1.5}
#: (b)/(c) at least this for every task: (b) within 5% of (c).
TARGET_B_OVER_C = 0.95
#: Cores busy with other processes during a run above which the table marks the run.
DISTURBED = 0.3

TASKS = {
    # script, overrides that make every trial do the same work
    "mlp": ("examples/ddp_mlp.py", ["epochs=40", "model.n_layers=2", "model.units_low=512", "model.units_high=512"]),
    "train": ("examples/train.py", ["hydra.sweeper.enqueue_trials=null", "data.train_size=128", "data.eval_size=64"]),
}
#: The main job's slice on GPUs (``--gpu``): bench/gpu_check.py's main-job slice, bf16.
TRAIN_GPU = ["hydra.sweeper.enqueue_trials=null", "data.train_size=1024", "data.eval_size=256", "training.bf16=true"]


def task_overrides(task: str, gpu: bool) -> tuple[str, list[str]]:
    script, overrides = TASKS[task]
    return script, (TRAIN_GPU if gpu and task == "train" else overrides)


def torchrun_cmd(nproc: int, script: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            str(REPO / script), *args]


def arm_label(arm: str, args: argparse.Namespace) -> str:
    w, k = args.nproc, args.n_jobs
    return {
        "a": f"(a) {args.a_nproc} rank{'s' if args.a_nproc > 1 else ''}, n_jobs=1",
        "b": f"(b) {w} ranks, n_jobs={k}",
        "c": f"(c) {k} torchrun launches of {w // k} rank{'s' if w // k > 1 else ''}, one PostgreSQL study",
    }[arm]


def commands(task: str, arm: str, args: argparse.Namespace, run_dir: Path, study_name: str) -> list[list[str]]:
    """The command(s) of one run of ``arm``: one launch for (a) and (b), ``n_jobs`` launches for (c)."""
    script, overrides = task_overrides(task, args.gpu)
    common = [f"hydra.sweeper.study_name={study_name}", f"hydra.sweeper.n_trials={args.trials}",
              "hydra.sweeper.sampler.seed=0", "hydra.sweeper.plots=false", *NO_PRUNING, *overrides]
    if arm == "a":
        return [torchrun_cmd(args.a_nproc, script, ["-m", f"hydra.sweep.dir={run_dir / 'sweep'}",
                                                    "hydra.sweeper.n_jobs=1", *common])]
    if arm == "b":
        return [torchrun_cmd(args.nproc, script, ["-m", f"hydra.sweep.dir={run_dir / 'sweep'}",
                                                  f"hydra.sweeper.n_jobs={args.n_jobs}", *common])]
    return [torchrun_cmd(args.nproc // args.n_jobs, script,
                         ["-m", f"hydra.sweep.dir={run_dir / f'sweep_g{i}'}", f"hydra.sweeper.storage='{args.storage}'",
                          *common]) for i in range(args.n_jobs)]


def launch(cmds: list[list[str]], run_dir: Path, timeout_s: float) -> tuple[float, list[float], float]:
    """Start ``cmds`` at the same moment; return (wall seconds to the last exit, their CPU seconds, start time).

    Raises:
        SystemExit: a command failed or ran past ``timeout_s`` (its process group is killed).
    """
    e = env()
    procs, logs = [], []
    t0 = time.time()
    for i, cmd in enumerate(cmds):
        logs.append(open(run_dir / f"log_{i}.txt", "w"))
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=e, stdout=logs[-1], stderr=subprocess.STDOUT,
                                      start_new_session=True))
    ended, cpu_s, rcs = [0.0] * len(procs), [0.0] * len(procs), [None] * len(procs)
    pending = set(range(len(procs)))
    while pending:
        for i in list(pending):
            pid, status, usage = os.wait4(procs[i].pid, os.WNOHANG)
            if pid:
                ended[i], cpu_s[i] = time.time(), usage.ru_utime + usage.ru_stime
                rcs[i] = os.waitstatus_to_exitcode(status)
                pending.discard(i)
        if pending and time.time() - t0 > timeout_s:
            for i in pending:
                os.killpg(procs[i].pid, 9)
            raise SystemExit(f"a run ran past {timeout_s:.0f} s; see the logs in {run_dir}")
        time.sleep(0.05)
    for f in logs:
        f.close()
    if any(rcs):
        raise SystemExit(f"exit codes {rcs}; see the logs in {run_dir}")
    return max(ended) - t0, cpu_s, t0


def run(task: str, arm: str, repeat: int, args: argparse.Namespace, workdir: Path) -> dict:
    """One run of ``arm`` on ``task``: wall time, stored trials, trials per hour, where the time went."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study_name = f"bench-trial-groups-{task}-{arm}-{uuid.uuid4().hex[:8]}"
    run_dir = workdir / f"{task}_{arm}_{repeat}"
    run_dir.mkdir(parents=True)
    quiet_before = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
    cmds = commands(task, arm, args, run_dir, study_name)
    load_before, busy0 = loadavg(), cpu_busy_s()
    print(f"{task} {arm_label(arm, args)}, repeat {repeat + 1}/{args.repeat} ...", flush=True)
    storage = args.storage if arm == "c" else f"sqlite:///{run_dir / 'sweep' / 'optuna.db'}"
    try:
        wall, cpu_s, t0 = launch(cmds, run_dir, args.timeout)
        other = max(0.0, (cpu_busy_s() - busy0 - sum(cpu_s)) / wall)
        trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
    finally:
        if arm == "c":  # the shared server keeps no study of ours, whatever happened
            try:
                optuna.delete_study(study_name=study_name, storage=storage)
            except KeyError:  # never created (the launches failed first)
                pass
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    starts = [t.datetime_start.timestamp() for t in trials if t.datetime_start]
    ends = [t.datetime_complete.timestamp() for t in trials if t.datetime_complete]
    groups: dict[str, int] = {}
    for t in trials:
        g = t.user_attrs.get("ds_optuna:trial_group")
        if g is not None:
            groups[str(g)] = groups.get(str(g), 0) + 1
    r = {
        "task": task, "arm": arm, "repeat": repeat, "label": arm_label(arm, args),
        "wall_s": wall,
        "trials_stored": len(trials),
        "trials_finished": len(complete),
        "states": {s.name: sum(t.state == s for t in trials) for s in TrialState if any(t.state == s for t in trials)},
        "trials_per_hour": 3600 * len(complete) / wall,
        "trials_per_group": groups,
        "trial_median_s": median([(t.datetime_complete - t.datetime_start).total_seconds() for t in complete]),
        "start_to_first_trial_s": min(starts) - t0 if starts else None,
        "last_trial_to_exit_s": t0 + wall - max(ends) if ends else None,
        "cpu_s": cpu_s,
        "other_cores_busy": other,
        "other_cores_before": quiet_before,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "commands": [shown_command(c, workdir).replace(args.storage, redact(args.storage)) for c in cmds],
    }
    print(f"  {r['trials_finished']} trials in {wall:.1f} s: {r['trials_per_hour']:.0f} trials/h, trial median "
          f"{r['trial_median_s']:.2f} s, {other:.2f} cores busy with other processes", flush=True)
    return r


def verdict(ratio: float, target: float | None) -> str:
    if target is None:
        return "no target"
    return f">= {target}x: {'met' if ratio >= target else '**missed**'}"


def summarize(runs: list[dict], args: argparse.Namespace) -> tuple[str, str, dict]:
    """The Markdown tables and the per-task medians and ratios."""
    rows, ratio_rows, summary = [], [], {}
    for task in args.tasks:
        med = {}
        for arm in args.arms:
            rs = [r for r in runs if r["task"] == task and r["arm"] == arm]
            tph = median([r["trials_per_hour"] for r in rs])
            med[arm] = tph
            busy = max(r["other_cores_busy"] for r in rs)
            rows.append([
                task, rs[0]["label"], " ".join(str(r["trials_finished"]) for r in rs),
                " ".join(f"{r['wall_s']:.1f}" for r in rs), " ".join(f"{r['trials_per_hour']:.0f}" for r in rs),
                f"**{tph:.0f}**", f"{median([r['trial_median_s'] for r in rs]):.2f}",
                f"{median([r['start_to_first_trial_s'] for r in rs]):.1f}",
                " ".join(f"{r['other_cores_busy']:.2f}" for r in rs) + (" (disturbed)" if busy > DISTURBED else ""),
            ])
        s = {"median_trials_per_hour": med}
        judged = not args.gpu and args.nproc == 2 and args.n_jobs == 2 and args.a_nproc == 2
        if "a" in med and "b" in med:
            s["b_over_a"] = med["b"] / med["a"]
            t = TARGET_B_OVER_A.get(task) if judged else None
            s["b_over_a_target"], s["b_over_a_met"] = t, (s["b_over_a"] >= t if t else None)
        if "c" in med and "b" in med:
            s["b_over_c"] = med["b"] / med["c"]
            t = TARGET_B_OVER_C if judged else None
            s["b_over_c_target"], s["b_over_c_met"] = t, (s["b_over_c"] >= t if t else None)
        summary[task] = s
        ratio_rows.append([
            task,
            f"**{s['b_over_a']:.2f}x** ({verdict(s['b_over_a'], s['b_over_a_target'])})" if "b_over_a" in s else "-",
            f"**{s['b_over_c']:.2f}x** ({verdict(s['b_over_c'], s['b_over_c_target'])})" if "b_over_c" in s else "-",
        ])
    table = markdown_table(["task", "arm", "trials", "wall s", "trials per hour", "median trials per hour",
                            "median trial s", "median start to first trial s", "cores busy with other processes"],
                           rows)
    ratios = markdown_table(["task", "(b)/(a) trials per hour", "(b)/(c) trials per hour"], ratio_rows)
    return table, ratios, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["mlp", "train"], choices=sorted(TASKS))
    ap.add_argument("--arms", nargs="+", default=["a", "b", "c"], choices=["a", "b", "c"])
    ap.add_argument("--trials", type=int, default=6, help="the budget (n_trials) of every run")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each arm, interleaved; medians compared")
    ap.add_argument("--nproc", type=int, default=2, help="ranks of (b)'s launch, and of (c)'s launches together")
    ap.add_argument("--n-jobs", type=int, default=2, help="(b)'s trial groups and (c)'s launches")
    ap.add_argument("--a-nproc", type=int, default=None, help="ranks of (a)'s launch (default: --nproc)")
    ap.add_argument("--gpu", action="store_true", help="the GPU form: the main job on its GPU slice with bf16")
    ap.add_argument("--storage", default=DEFAULT_STORAGE, help="(c)'s PostgreSQL URL")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before a run is killed")
    ap.add_argument("--wait-quiet", type=float, default=60,
                    help="seconds at most to wait before each run for other processes to leave the cores idle")
    ap.add_argument("--attempts", type=int, default=2,
                    help="measurements of a run at most: a run disturbed by other processes is measured again")
    ap.add_argument("--out", default=str(RESULTS.relative_to(REPO)), help="folder of the result files")
    ap.add_argument("--name", default="trial_groups", help="stem of the result files")
    ap.add_argument("--no-save", action="store_true", help="print only; keep the result files as they are")
    args = ap.parse_args()
    args.a_nproc = args.a_nproc or args.nproc
    if args.nproc % args.n_jobs:
        ap.error(f"--n-jobs {args.n_jobs} does not divide --nproc {args.nproc}")
    command = "python " + shlex.join(["bench/trial_groups.py", *sys.argv[1:]]).replace(args.storage,
                                                                                     redact(args.storage))
    t_start = time.monotonic()
    runs, dropped = [], []
    with tempfile.TemporaryDirectory(prefix="dso-trial-groups-") as tmp:
        for rep in range(args.repeat):
            order = args.arms[rep % len(args.arms):] + args.arms[:rep % len(args.arms)]  # rotated each repeat
            for task in args.tasks:
                for arm in order:
                    tries = []
                    for attempt in range(args.attempts):
                        tries.append(run(task, arm, rep, args, Path(tmp) / f"attempt{attempt}"))
                        if tries[-1]["other_cores_busy"] <= DISTURBED:
                            break
                        if attempt + 1 < args.attempts:
                            print("  disturbed by other processes; measuring again", flush=True)
                    best = min(tries, key=lambda r: r["other_cores_busy"])  # the least disturbed measurement
                    runs.append(best)
                    dropped += [r for r in tries if r is not best]
    total_s = time.monotonic() - t_start
    table, ratios, summary = summarize(runs, args)
    disturbed = sorted({f"{r['task']} {r['arm']}" for r in runs if r["other_cores_busy"] > DISTURBED})
    slices = ", ".join(f"{t}: `{TASKS[t][0]} {' '.join(task_overrides(t, args.gpu)[1])}`" for t in args.tasks)
    md = (
        f"# Trial groups in one launch vs one trial at a time vs hand-started groups\n\n"
        f"Budget n_trials={args.trials} per run, sampler seed 0, no pruning, each run on a fresh sweep dir and study; "
        f"{args.repeat} run(s) of each arm, interleaved. Tasks: {slices}. Wall s: launch to the last exit. "
        f"Trials: COMPLETE trials the stored study holds, per run.\n\n{table}\n\n{ratios}\n"
        + (f"\n**Disturbed** (other processes kept more than {DISTURBED} cores busy during a run): "
           f"{', '.join(disturbed)}.\n" if disturbed else "")
        + (f"\n{len(dropped)} run(s) measured again for load from other processes (the dropped measurements are in "
           "the JSON file).\n" if dropped else "")
        + f"\nWhole benchmark: {total_s / 60:.1f} min. One command of each arm (task {args.tasks[-1]}):\n\n"
        + "".join(f"- {r['label']}: `{' ; '.join(r['commands'])}`\n" for r in runs
                  if r["repeat"] == 0 and r["task"] == args.tasks[-1])
    )
    data = {"trials": args.trials, "repeat": args.repeat, "nproc": args.nproc, "n_jobs": args.n_jobs,
            "a_nproc": args.a_nproc, "gpu": args.gpu, "storage": redact(args.storage),
            "target_b_over_a": TARGET_B_OVER_A, "target_b_over_c": TARGET_B_OVER_C, "summary": summary,
            "total_s": total_s, "runs": runs,
            "dropped_runs_with_other_load": dropped}
    if args.no_save:
        print(md)
    else:
        out = Path(args.out)
        save(args.name, md, data, command, out=out if out.is_absolute() else REPO / out)


if __name__ == "__main__":
    main()
