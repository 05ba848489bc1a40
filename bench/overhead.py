"""Sweeper overhead per trial with a trivial task (no training), at 2, 4 and 8 ranks on CPU/gloo.

For each world size, one sweep of N trials of tests/apps/sweep_app.py; every rank writes per-phase
timings (DS_OPTUNA_TIMINGS, see hydra_plugins/ds_optuna_sweeper/_loop/_timings.py: PhaseTimer). Reported,
as median and p95 over the trials (the first 3 dropped as warm-up):

- ask, tell: rank 0's Study.ask/tell with the sampler and storage (plus the budget count);
- compose: Hydra's per-job work in launcher.launch (config rebuild, logging set-up, .hydra files),
  i.e. launch minus our config check minus the task, on rank 0;
- comm: our rank communication (payload broadcast + config-fingerprint gather + result gather)
  measured on the rank that arrives last at each collective (the minimum over ranks), which is the
  transfer cost without the waiting for slower ranks;
- total: rank 0's wall time per trial.

Targets: under 100 ms per trial in all, of which under 5 ms of our own rank communication (comm), at every
world size; the default SQLite storage should add little over an in-memory study.

    python bench/overhead.py [--trials 50] [--ranks 2 4 8] [--storage sqlite|memory] [--out DIR] [--name NAME]

``--out`` (default ``bench/results``) and ``--name`` (default ``overhead``) say where the table goes:
``bench/gpu_check.py`` passes ``bench/results/gpu`` so that its runs never replace the CPU table docs/performance.md cites.
"""

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, markdown_table, median, pct, save, torchrun  # noqa: E402

MEMORY_STORAGE = "+hydra.sweeper.storage={_target_:optuna.storages.InMemoryStorage}"


def run(world: int, trials: int, storage: str, workdir: Path) -> dict:
    timings = workdir / f"timings_{world}_{storage}.jsonl"
    args = ["-m", f"hydra.sweep.dir={workdir / f'sweep_{world}_{storage}'}", f"hydra.sweeper.n_trials={trials}",
            "x=interval(-1,1)", "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=120"]
    if storage == "memory":
        args.append(MEMORY_STORAGE.replace("+hydra", "hydra"))
    rc = torchrun(world, "tests/apps/sweep_app.py", args, timeout_s=900,
                  extra_env={"DS_OPTUNA_TIMINGS": str(timings)}, log_path=workdir / f"log_{world}_{storage}.txt")
    if rc != 0:
        raise SystemExit(f"sweep at {world} ranks failed (exit {rc}); see {workdir}/log_{world}_{storage}.txt")
    per_trial: dict[int, dict[int, dict]] = defaultdict(dict)
    for line in timings.read_text().splitlines():
        rec = json.loads(line)
        per_trial[rec["trial"]][rec["rank"]] = rec["phases"]
    numbers = sorted(per_trial)[3:]
    series = defaultdict(list)
    for n in numbers:
        ranks = per_trial[n]
        r0 = ranks[0]
        series["ask"].append(r0.get("ask", 0.0))
        series["tell"].append(r0.get("tell", 0.0))
        series["compose"].append(r0["launch"] - r0.get("config_check", 0.0) - r0.get("task", 0.0))
        series["comm"].append(
            min(p.get("broadcast", 0) for p in ranks.values())
            + min(p.get("config_check", 0) for p in ranks.values())
            + min(p.get("gather", 0) for p in ranks.values())
        )
        series["total"].append(sum(r0.get(k, 0.0) for k in ("ask", "broadcast", "launch", "gather", "tell")))
    return {k: {"median_ms": 1000 * median(v), "p95_ms": 1000 * pct(v, 95)} for k, v in series.items()} | {
        "trials_measured": len(numbers)
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--storage", nargs="+", default=["sqlite", "memory"], choices=["sqlite", "memory"])
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for <name>.md/.json (default bench/results)")
    ap.add_argument("--name", default="overhead", help="file stem of the result (default overhead)")
    args = ap.parse_args()
    results = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.ranks:
            for storage in args.storage:
                r = run(world, args.trials, storage, Path(tmp))
                results[f"{world}_{storage}"] = r
                rows.append(
                    [world, storage]
                    + [f"{r[k]['median_ms']:.1f} / {r[k]['p95_ms']:.1f}" for k in ("ask", "compose", "comm", "tell", "total")]
                )
                print(rows[-1], flush=True)
    table = markdown_table(
        ["ranks", "storage", "ask ms", "compose ms", "comm ms", "tell ms", "total ms"], rows
    ) + "\n\nEach cell: median / p95 over the trials (ms). sqlite = the default storage in the sweep dir; memory = Optuna's in-memory storage on rank 0."
    cmd = "python bench/overhead.py " + " ".join(sys.argv[1:])
    save(args.name, table, {"trials": args.trials, "results": results}, cmd.strip(), out=args.out)


if __name__ == "__main__":
    main()
