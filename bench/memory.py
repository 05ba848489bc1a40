"""Memory across many trials in one torchrun world: is there a leak, or noise and warm-up? (case C14)

Runs ``tests/apps/trial_loop.py`` (trials of ``examples/train.py``'s task back to back, as a sweep runs them)
with the ZeRO stage alternating 3, 1, 2, ... on a tiny data slice. After each trial every rank collects
garbage, calls glibc's ``malloc_trim(0)`` and records its resident memory, glibc's heap bytes in use and
free, and the live DeepSpeed engines, Trainers, ``nn.Parameter``s, tensors and module hooks (counted over
``gc.get_objects()``). Prints one row per trial and a summary:

- RSS after trial N vs after trial 1 (the promise of case C14: within 5%), and vs after trial 2 (warm-up
  excluded);
- the least-squares slope of RSS per trial from trial 2 on (MiB per trial);
- the same for glibc's heap bytes in use, which a leak of tensors or engines raises by the model's size per
  trial, and which allocator fragmentation does not move.

    python bench/memory.py [--trials 12] [--nproc 2]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, save, torchrun  # noqa: E402

TINY = ["data.train_size=64", "data.eval_size=32", "training.warmup_steps=0"]
STAGES = (3, 1, 2)


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, ... (units of ``ys`` per step)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def summary(series: list[float], warm: int) -> dict[str, float]:
    """Growth of ``series`` (one value per trial) vs trial 1 and vs trial ``warm + 1``, and the slope after it."""
    return {
        "vs_trial1_pct": 100 * (series[-1] / series[0] - 1),
        "vs_warm_pct": 100 * (series[-1] / series[warm] - 1),
        "max_vs_warm_pct": 100 * (max(series[warm:]) / series[warm] - 1),
        "slope_after_warm_mib_per_trial": slope(series[warm:]),
        "slope_last_half_mib_per_trial": slope(series[len(series) // 2:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="trials excluded as warm-up (the baseline is the next)")
    args = ap.parse_args()
    stages = [STAGES[i % len(STAGES)] for i in range(args.trials)]
    trials = [TINY + [f"deepspeed=zero{s}"] for s in stages]
    with tempfile.TemporaryDirectory() as tmp:
        records = Path(tmp) / "records"
        t0 = time.monotonic()
        rc = torchrun(args.nproc, "tests/apps/trial_loop.py", [json.dumps(trials)], timeout_s=3600,
                      extra_env={"DSO_RECORD_DIR": str(records)}, log_path=Path(tmp) / "loop.log")
        wall_s = time.monotonic() - t0
        if rc != 0:
            raise SystemExit(f"trial loop failed ({rc}):\n{(Path(tmp) / 'loop.log').read_text()[-4000:]}")
        probes = [[json.loads((records / f"memory_trial{t}_rank{r}.json").read_text()) for r in range(args.nproc)]
                  for t in range(args.trials)]
        recs = [[json.loads((records / f"trial{t}_rank{r}.json").read_text()) for r in range(args.nproc)]
                for t in range(args.trials)]

    ranks = range(args.nproc)
    rows = []
    for t, (per_rank, rec) in enumerate(zip(probes, recs)):
        rows.append([
            t + 1, stages[t],
            " / ".join(f"{p['rss_mib']:.1f}" for p in per_rank),
            " / ".join(f"{p['heap_in_use_mib']:.1f}" for p in per_rank),
            " / ".join(f"{p['heap_free_mib']:.1f}" for p in per_rank),
            " / ".join(f"{r['live_engines_during_trial']}->{p['engines']}" for p, r in zip(per_rank, rec)),
            " / ".join(str(p["parameters"]) for p in per_rank),
            " / ".join(str(p["tensors"]) for p in per_rank),
            " / ".join(str(p["module_hooks"]) for p in per_rank),
            " / ".join(str(p["trainers"]) for p in per_rank),
        ])
    header = ["trial", "stage", "RSS MiB", "heap in use MiB", "heap free MiB", "engines during->after",
              "params", "tensors", "module hooks", "trainers"]
    table = markdown_table(header, rows)
    stats = {}
    lines = []
    for r in ranks:
        rss = summary([p[r]["rss_mib"] for p in probes], args.warmup)
        heap = summary([p[r]["heap_in_use_mib"] for p in probes], args.warmup)
        stats[f"rank{r}"] = {"rss": rss, "heap_in_use": heap}
        lines.append(
            f"- rank {r}: RSS after trial {args.trials} vs trial 1 **{rss['vs_trial1_pct']:+.1f}%**, vs trial "
            f"{args.warmup + 1} {rss['vs_warm_pct']:+.1f}% (max {rss['max_vs_warm_pct']:+.1f}%), slope from trial "
            f"{args.warmup + 1} on {rss['slope_after_warm_mib_per_trial']:+.2f} MiB/trial "
            f"({100 * rss['slope_after_warm_mib_per_trial'] / probes[args.warmup][r]['rss_mib']:+.2f}%), over the "
            f"last half {rss['slope_last_half_mib_per_trial']:+.2f} MiB/trial; glibc heap in use vs trial 1 "
            f"{heap['vs_trial1_pct']:+.1f}%, slope over the last half {heap['slope_last_half_mib_per_trial']:+.3f} "
            f"MiB/trial")
    leak = any(p[r][k] > max(q[r][k] for q in probes[:3]) for p in probes[3:] for r in ranks
               for k in ("engines", "trainers", "parameters", "tensors", "module_hooks"))
    lines.append(
        "- verdict: " + ("**objects survive trials: a leak**" if leak else
                         "no engine, Trainer, parameter, tensor or module hook survives a trial; glibc's bytes in "
                         "use are flat after warm-up, so RSS movements are allocator retention (free bytes kept "
                         "inside glibc's heap, the 'heap free' column), not a leak"))
    table += (f"\n\nEach cell: rank 0 / rank 1, after the trial's teardown, `gc.collect()` and `malloc_trim(0)`. "
              f"{args.nproc} ranks, {args.trials} trials, ZeRO stages {'-'.join(map(str, stages))}, data slice "
              f"{' '.join(TINY)}, {wall_s:.0f} s in all.\n\n" + "\n".join(lines))
    save("memory", table, {"trials": args.trials, "nproc": args.nproc, "stages": stages, "warmup": args.warmup,
                           "wall_s": wall_s, "summary": stats, "probes": probes,
                           "records": [[{k: r[k] for k in ("rss_mib_after_teardown", "live_engines_during_trial",
                                                           "live_engines_after_teardown", "engine_zero_stage")}
                                        for r in per_rank] for per_rank in recs]},
         f"python bench/memory.py --trials {args.trials} --nproc {args.nproc} --warmup {args.warmup}")


if __name__ == "__main__":
    main()
