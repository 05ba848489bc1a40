"""Schedulers: promotion ASHA vs no early stopping, the median pruner and successive halving (issue 41).

The digits MLP (``examples/ddp_mlp.py``, validation accuracy maximized over its 12 epochs, ``trial.report(acc,
epoch)`` after each epoch) under torchrun at 2 ranks, as ``bench/pruning.py`` runs it. Every arm gets the same
compute budget, in epochs: ``--trials`` full configurations (``--trials * 12`` epochs, what ``none`` spends), with
the same TPE sampler seed, for each seed of ``--seeds``. An arm that stops or pauses trials fits more
configurations into the budget, so it is given ``--trials`` times its factor in :data:`CONFIGS` (``n_trials``) and
its study is read up to the budget: the trials in the order they finished (one runs at a time), the epochs each
trained counted up, and what finished within the budget counts (its best value, its epochs). The arms:

- ``none``: no early stopping (``hydra/sweeper/pruner=nop``);
- ``median``: the example's own median pruner (``conf/ddp_mlp.yaml``: Optuna's defaults, 5 start-up trials,
  no warm-up);
- ``successive_halving``: Optuna's ``SuccessiveHalvingPruner`` with its defaults
  (``hydra/sweeper/pruner=successive_halving``);
- ``asha``: promotion ASHA, ``hydra/sweeper/pruner=nop hydra/sweeper/scheduler=asha`` with ``min_steps=1``,
  ``max_steps=12``, ``reduction_factor=3`` (rungs at reported steps 1, 3 and 9; the example reports 0-based
  epochs, 0 to 11, so a trial pauses after 2, 4 and 10 epochs, plus the one batch it trains before its next
  ``should_preempt()``, which its continuation does not train again).

- ``pbt``: population-based training, ``hydra/sweeper/pruner=nop hydra/sweeper/scheduler=pbt`` with
  ``interval=3``, ``max_steps=12`` and ``mutations=[lr]`` (Ray Tune's defaults otherwise: quantile 0.25,
  resample probability 0.25, factors 0.8 and 1.2): the ``n_trials`` members all train 12 epochs, as ``none``'s
  configurations do, so the two arms spend equal epochs.

No arm is tuned. Each study is read back: best value (COMPLETE trials), epochs trained (per trial, the steps it
reported itself: an ASHA continuation's inherited steps, those in the intermediate values of the trial it
continues, are not counted again), optimizer steps (from the ``optimizer_steps`` user attribute, or, for a
trial paused at a rung, from its checkpoint ``step=<n>.ckpt``; minus the steps of the checkpoint it resumed
from), wall time of the sweep, trials, configurations and COMPLETE trials.

Target for PBT (issue 41, here on the digits MLP, not the main job): its best value at least as good as the best
fixed configuration's (``none``) with no more epochs (PBT trains fewer: a clone skips to its donor's step).

Target (issue 41): promotion ASHA reaches the best value of the best stopping arm (``median`` or
``successive_halving``, whichever has the better best value within the budget in that seed; a tie: the one that
reached it with fewer epochs) with at most 70% of its epochs (those it spent within the budget), in at least 2 of
3 seeds: ASHA's epochs up to the first COMPLETE trial whose value is at least that best. The table also shows the
epochs the stopping arm needed to first reach its best (a stricter reading, for the record).

    python bench/schedulers.py [--trials 16] [--seeds 0 1 2] [--arms none pbt]

A run of some arms only writes ``bench/results/schedulers_<arms>.md`` (``schedulers.md`` holds the run of all).
"""

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, save, torchrun  # noqa: E402

SCRIPT, STUDY = "examples/ddp_mlp.py", "ddp_mlp"
NPROC = 2
ARMS = {
    "none": ["hydra/sweeper/pruner=nop"],
    "median": [],  # conf/ddp_mlp.yaml's default: hydra/sweeper/pruner=median, Optuna's defaults
    "successive_halving": ["hydra/sweeper/pruner=successive_halving"],
    "asha": ["hydra/sweeper/pruner=nop", "hydra/sweeper/scheduler=asha", "hydra.sweeper.scheduler.min_steps=1",
             "hydra.sweeper.scheduler.max_steps=12", "hydra.sweeper.scheduler.reduction_factor=3"],
    "pbt": ["hydra/sweeper/pruner=nop", "hydra/sweeper/scheduler=pbt", "hydra.sweeper.scheduler.interval=3",
            "hydra.sweeper.scheduler.max_steps=12", "hydra.sweeper.scheduler.mutations=[lr]"],
}
STOPPING = ("median", "successive_halving")
#: configurations per arm, as a factor of ``--trials``: enough to fill the epoch budget (at 16, median spent 56-73% of
#: ``none``'s epochs, successive halving 44-48%, ASHA 34-44% at the same configurations: bench/results, stop 53)
CONFIGS = {"none": 1, "median": 2, "successive_halving": 3, "asha": 3, "pbt": 1}
EPOCHS = 12  # the example's epochs per configuration
TARGET_FRACTION = 0.70
TARGET_SEEDS = 2
CONTINUES, PAUSED, RESUMED_FROM, CKPT_DIR = ("ds_optuna:continues", "ds_optuna:paused_at", "ds_optuna:resumed_from",
                                             "ds_optuna:checkpoint_dir")
CLONE = "ds_optuna:pbt_clone"
STEP_FILE = re.compile(r"step=(\d+)\.ckpt$")


def _ckpt_steps(path: str | None) -> int | None:
    m = STEP_FILE.search(path or "")
    return int(m.group(1)) if m else None


def _parent(t) -> int | None:
    """The number of the trial ``t`` continues (a promoted ASHA trial's continuation), or None."""
    if t.user_attrs.get(CONTINUES) is not None:
        return int(t.user_attrs[CONTINUES])
    history = t.system_attrs.get("retry_history") or []
    return int(history[-1]) if history else None


def read_study(storage: str, study_name: str = STUDY) -> dict:
    """The figures of one finished sweep (see the module docstring), with one row per trial."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage)
    trials = {t.number: t for t in study.trials}
    rows, roots = [], set()
    epochs = steps = 0
    steps_known = True
    for t in trials.values():
        parent = _parent(t)
        donor = (t.user_attrs.get(CLONE) or {}).get("from_trial", parent)  # a PBT clone inherits its donor's curve
        inherited = set(trials[donor].intermediate_values) if donor is not None else set()
        own = sorted(set(t.intermediate_values) - inherited)
        start = _ckpt_steps(t.user_attrs.get(RESUMED_FROM)) if parent is not None else 0
        end = t.user_attrs.get("optimizer_steps")
        if end is None and t.user_attrs.get(PAUSED) is not None:  # paused: its checkpoint holds its step count
            d = Path(t.user_attrs.get(CKPT_DIR) or "")
            files = sorted(d.glob("step=*.ckpt")) if d.is_dir() else []
            # the checkpoint is the pause's unless a continuation (same directory) has written its own since
            later = [c for c in trials.values() if _parent(c) == t.number]
            if later and later[0].user_attrs.get(CLONE):
                end = None  # a PBT clone replaced the checkpoint: its step count is not on disk (epochs still are)
            elif later:
                end = _ckpt_steps(later[0].user_attrs.get(RESUMED_FROM))
            elif files:
                end = max(_ckpt_steps(str(f)) for f in files)
        own_steps = None if end is None or start is None else end - start
        steps_known &= own_steps is not None
        steps += own_steps or 0
        epochs += len(own)
        root = t.number
        while _parent(trials[root]) is not None:
            root = _parent(trials[root])
        roots.add(root)
        rows.append({"number": t.number, "state": t.state.name, "continues": parent,
                     "finished": t.datetime_complete.timestamp() if t.datetime_complete else None,
                     "paused_at": t.user_attrs.get(PAUSED),
                     "own_steps_reported": own, "inherited_steps": sorted(inherited), "optimizer_steps": own_steps,
                     "value": t.value, "params": t.params})
    states: dict[str, int] = {}
    for t in trials.values():
        states[t.state.name] = states.get(t.state.name, 0) + 1
    complete = [t for t in trials.values() if t.state.name == "COMPLETE"]
    return {"best": study.best_value if complete else None, "epochs": epochs,
            "optimizer_steps": steps if steps_known else None, "trials": len(trials), "configurations": len(roots),
            "complete": len(complete), "states": states, "per_trial": rows}


def timed_sweep(script: str, study: str, name: str, args: list[str], workdir: Path, timeout_s: float) -> dict:
    """``torchrun`` (:data:`NPROC` ranks) ``script -m hydra.sweep.dir=<workdir>/<name> *args``; its figures
    (:func:`read_study` of study ``study``) with ``wall_s``. Exits with the log's tail when the sweep fails."""
    sweep, log = workdir / name, workdir / f"{name}.log"
    t0 = time.monotonic()
    rc = torchrun(NPROC, script, ["-m", f"hydra.sweep.dir={sweep}", *args], timeout_s=timeout_s, log_path=log)
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"{name} failed (exit {rc}); log:\n" + log.read_text()[-4000:])
    res = read_study(f"sqlite:///{sweep}/optuna.db", study_name=study)
    res["wall_s"] = wall
    return res


def run(arm: str, seed: int, trials: int, workdir: Path) -> dict:
    """One sweep of ``arm`` with ``trials * CONFIGS[arm]`` configurations; :func:`read_study`'s figures and the
    budget's (:func:`within_budget`, ``trials * EPOCHS`` epochs) under ``"budget"``."""
    sweep = workdir / f"{arm}_seed{seed}"
    args = [f"hydra.sweeper.n_trials={trials * CONFIGS[arm]}", f"hydra.sweeper.study_name={STUDY}",
            f"hydra.sweeper.sampler.seed={seed}", "hydra.sweeper.plots=false", *ARMS[arm]]
    res = timed_sweep(SCRIPT, STUDY, sweep.name, args, workdir, timeout_s=1800)
    res["budget"] = within_budget(res, trials * EPOCHS)
    if arm == "asha" and res["complete"]:
        res["continuation_check"] = continuation_check(sweep, workdir / f"{arm}_seed{seed}_rerun.log")
    return res


def curve(res: dict) -> list[dict]:
    """The sweep as it went: per trial in the order it finished (trials run one at a time), the epochs spent so
    far (each trial's own reports, :func:`read_study`) and the best COMPLETE value so far (``None`` before one)."""
    done = sorted((r for r in res["per_trial"] if r["finished"] is not None), key=lambda r: (r["finished"], r["number"]))
    points, epochs, best = [], 0, None
    for r in done:
        epochs += len(r["own_steps_reported"])
        if r["state"] == "COMPLETE" and r["value"] is not None and (best is None or r["value"] > best):
            best = r["value"]
        points.append({"trial": r["number"], "epochs": epochs, "best": best, "finished": r["finished"],
                       "new_configuration": r["continues"] is None})
    return points


def within_budget(res: dict, budget: int) -> dict:
    """What the sweep found within ``budget`` epochs (the trials that finished before the count passed it): its
    best value, the epochs spent, the trials and configurations (first trials) finished, the time the last of
    them finished (``finished``, seconds since the epoch), and whether the arm filled the budget (it ran out of
    configurations first otherwise)."""
    points = [p for p in curve(res) if p["epochs"] <= budget]
    last = points[-1] if points else {"epochs": 0, "best": None, "trial": None, "finished": None}
    return {"budget_epochs": budget, "epochs": last["epochs"], "best": last["best"],
            "filled": res["epochs"] >= budget, "trials": len(points),
            "configurations": sum(1 for p in points if p["new_configuration"]), "finished": last["finished"]}


def epochs_to_reach(res: dict, value: float | None) -> int | None:
    """The epochs the sweep had spent when its best COMPLETE value first reached ``value`` (maximized), or None."""
    if value is None:
        return None
    return next((p["epochs"] for p in curve(res) if p["best"] is not None and p["best"] >= value), None)


SWEPT = ("model.n_layers", "lr")  # conf/ddp_mlp.yaml's hydra.sweeper.params; the other params are define-by-run
EPOCH_LINE = re.compile(r"epoch (\d+): val accuracy ([\d.]+)")


def continuation_check(sweep: Path, log: Path) -> dict:
    """Rerun ASHA's best COMPLETE trial's configuration from scratch in one go (no pause) and compare its
    per-epoch accuracy with the curve the paused-and-continued lineage stored (the log prints 4 decimals): a
    continuation from the wrong step or a lost optimizer state shows as a different curve."""
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{sweep}/optuna.db")
    best = study.best_trial
    inner = {k: v for k, v in best.params.items() if k not in SWEPT}
    rc = torchrun(NPROC, SCRIPT, [f"hydra.run.dir={sweep}/rerun", *(f"{k}={best.params[k]}" for k in SWEPT)],
                  timeout_s=600, log_path=log,
                  extra_env={"DS_OPTUNA_TRIAL": json.dumps({"number": best.number, "params": inner})})
    if rc != 0:
        raise SystemExit(f"the rerun of trial {best.number} failed (exit {rc}); log:\n" + log.read_text()[-4000:])
    rerun = {int(e): float(a) for e, a in EPOCH_LINE.findall(log.read_text())}
    stored = {int(k): float(v) for k, v in best.intermediate_values.items()}
    diff = max((abs(rerun.get(k, float("inf")) - v) for k, v in stored.items()), default=float("inf"))
    return {"trial": best.number, "epochs_stored": len(stored), "epochs_rerun": len(rerun),
            "max_abs_diff": diff, "matches": sorted(rerun) == sorted(stored) and diff < 1e-4}


def verdict(res: dict[str, dict]) -> dict:
    """Per seed, within the epoch budget: the best stopping arm and whether ASHA reached its best value with at
    most 70% of the epochs that arm spent."""
    def key(a):
        b = res[a]["budget"]["best"]
        return (-(b if b is not None else float("-inf")), epochs_to_reach(res[a], b) or 0)  # a tie: the faster arm
    ref = sorted(STOPPING, key=key)[0]
    ref_best, ref_epochs = res[ref]["budget"]["best"], res[ref]["budget"]["epochs"]
    asha_epochs = epochs_to_reach(res["asha"], ref_best)
    fraction = None if asha_epochs is None else asha_epochs / ref_epochs
    return {"reference": ref, "reference_best": ref_best, "reference_epochs": ref_epochs,
            "reference_epochs_to_its_best": epochs_to_reach(res[ref], ref_best),
            "asha_best": res["asha"]["budget"]["best"], "asha_epochs_to_reach": asha_epochs,
            "epoch_fraction": fraction, "value_reached": asha_epochs is not None and asha_epochs <= ref_epochs,
            "met": fraction is not None and fraction <= TARGET_FRACTION}


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16,
                    help="the budget in full configurations (x 12 epochs); n_trials is this times CONFIGS[arm]")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="TPE sampler seeds")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = ap.parse_args()
    data: dict = {"trials": args.trials, "nproc": NPROC, "arms": {a: ARMS[a] for a in args.arms}, "seeds": {}}
    rows, summary, pbt_rows = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            res = {}
            for arm in args.arms:
                res[arm] = run(arm, seed, args.trials, Path(tmp))
                r = res[arm]
                base = res.get("none")
                b = r["budget"]
                rows.append([seed, arm, r["configurations"], r["trials"], r["complete"], r["epochs"],
                             f"{r['epochs'] / base['epochs']:.0%}" if base else "-", _fmt(r["optimizer_steps"], "d"),
                             f"{r['wall_s']:.0f}", _fmt(r["best"], ".4f"), b["epochs"],
                             "yes" if b["filled"] else "no", _fmt(b["best"], ".4f"),
                             " ".join(f"{k}:{v}" for k, v in sorted(r["states"].items()))])
                print(rows[-1], flush=True)
            entry = {"results": res}
            if set(STOPPING) | {"asha"} <= set(res):
                v = verdict(res)
                entry["verdict"] = v
                check = res["asha"].get("continuation_check")
                summary.append([seed, v["reference"], _fmt(v["reference_best"], ".4f"), v["reference_epochs"],
                                _fmt(v["reference_epochs_to_its_best"], "d"), _fmt(v["asha_best"], ".4f"),
                                _fmt(v["asha_epochs_to_reach"], "d"), _fmt(v["epoch_fraction"], ".0%"),
                                "yes" if v["value_reached"] else "no",
                                "-" if check is None else ("yes" if check["matches"] else "**no**"),
                                "met" if v["met"] else "**missed**"])
                print(summary[-1], flush=True)
            if {"none", "pbt"} <= set(res):
                none_best, pbt_best = res["none"]["best"], res["pbt"]["best"]
                entry["pbt_verdict"] = {"none_best": none_best, "pbt_best": pbt_best,
                                        "epochs": [res["none"]["epochs"], res["pbt"]["epochs"]],
                                        "met": pbt_best is not None and pbt_best >= none_best
                                        and res["pbt"]["epochs"] <= res["none"]["epochs"]}
                v = entry["pbt_verdict"]
                pbt_rows.append([seed, _fmt(none_best, ".4f"), v["epochs"][0], _fmt(pbt_best, ".4f"), v["epochs"][1],
                                 "met" if v["met"] else "**missed**"])
            data["seeds"][str(seed)] = entry
    table = markdown_table(["seed", "arm", "configurations", "trials", "complete", "epochs trained", "epochs vs none",
                            "optimizer steps", "wall s", "best value", "epochs within budget", "budget filled",
                            "best within budget", "states"], rows)
    out = [table]
    if summary:
        met = sum(1 for s in summary if s[-1] == "met")
        overall = "met" if met >= TARGET_SEEDS else "**missed**"
        data["target"] = {"seeds_met": met, "seeds": len(summary), "needed": TARGET_SEEDS, "met": met >= TARGET_SEEDS}
        out += ["", markdown_table(["seed", "best stopping arm", "its best", "its epochs", "its epochs to its best",
                                    "asha best", "asha epochs to reach its best", "asha / its epochs",
                                    "value reached", "asha curve = rerun", "target"], summary),
                "", "Target (ASHA reaches the best stopping arm's best value with at most "
                f"{TARGET_FRACTION:.0%} of its epochs, in at least {TARGET_SEEDS} of 3 seeds; all within the budget "
                f"of {args.trials} x {EPOCHS} epochs): {overall} ({met} of {len(summary)} seeds)."]
    if pbt_rows:
        met = sum(1 for r in pbt_rows if r[-1] == "met")
        out += ["", markdown_table(["seed", "none best (best fixed configuration)", "none epochs", "pbt best",
                                    "pbt epochs", "target"], pbt_rows),
                "", f"Target (PBT's best at least the best fixed configuration's, with no more epochs): met in {met} of "
                f"{len(pbt_rows)} seeds."]
    if "asha" in args.arms:
        out += ["", "asha curve = rerun: ASHA's best configuration rerun from scratch without pauses gives the same "
                "per-epoch accuracy as its paused-and-continued trials stored (`continuation_check` in the JSON)."]
    out += ["", f"Settings: {NPROC} ranks (torchrun), `{SCRIPT}` ({EPOCHS} epochs), a budget of {args.trials} x "
            f"{EPOCHS} epochs per arm, n_trials = {args.trials} x "
            + ", ".join(f"{CONFIGS[a]} ({a})" for a in args.arms) + " configurations, "
            "TPE seeds " + ", ".join(map(str, args.seeds)) + "; arms: "
            + "; ".join(f"{a}: `{' '.join(ARMS[a]) or '(conf/ddp_mlp.yaml: median pruner, Optuna defaults)'}`"
                        for a in args.arms) + "."]
    name = "schedulers" if args.arms == list(ARMS) else "schedulers_" + "_".join(args.arms)
    save(name, "\n".join(out), data, "python bench/schedulers.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
