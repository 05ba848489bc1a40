"""Preempted trials (issue 24): what one preemption per trial costs with and without checkpoint resume.

Three arms run the same sweep of ``--trials`` trials of the plain DDP example ``examples/ddp_mlp.py`` (2 ranks,
2 hidden layers, ``--epochs`` epochs with ``step_sleep_s`` per step so a trial lasts seconds; learning rate
searched, sampler seed 0, no pruning, no plots), each on a fresh sweep dir and study:

- ``none``: no preemption, one launch;
- ``resume``: every trial is preempted once: SIGTERM to torchrun at a random point of its first attempt
  (uniform between 20% and 80% of the ``none`` arm's mean trial time, seeded), then the same command again,
  until the sweep finishes; each retry resumes from the checkpoint its attempt saved on ``should_preempt()``;
- ``scratch``: the same preemptions, but the trial's checkpoint directory is deleted before the relaunch, so
  the retry trains from step 0 (what happened before issue 24).

Measured per arm: optimizer steps spent (summed over every attempt, from the ranks' job logs: an attempt runs
from its ``from step S`` line to its last ``(N optimizer steps)`` or ``checkpoint saved at step N`` line),
launches, and wall seconds from the first launch to the last exit (each relaunch pays torchrun's and the
sweep's start-up, which a real preemption pays too). Target: ``resume`` within 15% of ``none`` in steps
(``scratch`` about +50%: half a trial lost per preemption on average).

    python bench/preemption.py --trials 4     # about 4 minutes on 2 idle cores

Writes ``bench/results/preemption.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, markdown_table, save  # noqa: E402

APP = REPO / "examples" / "ddp_mlp.py"
START = re.compile(r"trial (\d+): widths .* from step (\d+)")
STEPS = re.compile(r"\((\d+) optimizer steps\)|checkpoint saved at step (\d+)")


def _args(sweep: Path, trials: int, epochs: int, sleep_s: float) -> list[str]:
    return ["-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={trials}", f"epochs={epochs}",
            f"step_sleep_s={sleep_s}", "model.n_layers=choice(2)", "hydra/sweeper/pruner=nop",
            "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=120"]


def _launch(args: list[str], log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(APP), *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=log.open("w"), stderr=subprocess.STDOUT)


def _steps_spent(sweep: Path) -> int:
    """Optimizer steps of every attempt of every trial, from rank 0's job logs (``<trial>/ddp_mlp_rank0.log``)."""
    total = 0
    for log in sweep.glob("*/ddp_mlp_rank0.log"):
        start, last = None, None
        for line in log.read_text().splitlines():
            m = START.search(line)
            if m:
                if start is not None and last is not None:
                    total += last - start
                start, last = int(m.group(2)), int(m.group(2))
                continue
            m = STEPS.search(line)
            if m and start is not None:
                last = int(m.group(1) or m.group(2))
        if start is not None and last is not None:
            total += last - start
    return total


def _is_retry(sweep: Path, number: int) -> bool:
    """Whether trial ``number`` retries an earlier one (Optuna's ``failed_trial`` system attribute)."""
    import optuna

    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep / 'optuna.db'}")
    return "failed_trial" in study.trials[number].system_attrs


def run_none(work: Path, a: argparse.Namespace) -> dict:
    sweep = work / "none"
    t0 = time.monotonic()
    proc = _launch(_args(sweep, a.trials, a.epochs, a.sleep), work / "none.log")
    rc = proc.wait(timeout=a.timeout)
    wall = time.monotonic() - t0
    assert rc == 0, (work / "none.log").read_text()[-3000:]
    import optuna

    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep / 'optuna.db'}")
    seconds = [(t.datetime_complete - t.datetime_start).total_seconds() for t in study.trials]
    return {"wall_s": wall, "launches": 1, "steps": _steps_spent(sweep), "trial_s": sum(seconds) / len(seconds)}


def run_preempted(work: Path, a: argparse.Namespace, arm: str, trial_s: float) -> dict:
    sweep, rng = work / arm, random.Random(a.seed)
    args = _args(sweep, a.trials, a.epochs, a.sleep)
    preempted: set[int] = set()
    launches, t0 = 0, time.monotonic()
    while True:
        launches += 1
        log = work / f"{arm}{launches}.log"
        proc = _launch(args, log)
        target = None  # the first attempt of a trial not preempted yet
        while proc.poll() is None:
            if target is None:
                found = [int(n) for n, s in START.findall(log.read_text()) if s == "0"]
                fresh = [n for n in found if n not in preempted and not _is_retry(sweep, n)]
                if fresh:
                    target = fresh[0]
                    time.sleep(rng.uniform(0.2, 0.8) * trial_s)
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)
                        preempted.add(target)
            time.sleep(0.1)
        if proc.returncode == 0 and target is None:
            break
        if launches > 3 * a.trials + 2:
            raise RuntimeError(f"{arm}: no end after {launches} launches; see {log}")
        if arm == "scratch" and target is not None:
            shutil.rmtree(sweep / "checkpoints" / f"trial{target}", ignore_errors=True)
    return {"wall_s": time.monotonic() - t0, "launches": launches, "steps": _steps_spent(sweep),
            "preempted": sorted(preempted)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--sleep", type=float, default=0.05, help="seconds of sleep per optimizer step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_preemption_") as tmp:
        work = Path(tmp)
        none = run_none(work, a)
        arms = {"none": none, "resume": run_preempted(work, a, "resume", none["trial_s"]),
                "scratch": run_preempted(work, a, "scratch", none["trial_s"])}
    rows = [[arm, r["launches"], r["steps"], f"{r['steps'] / none['steps']:.2f}x", f"{r['wall_s']:.1f}",
             f"{r['wall_s'] / none['wall_s']:.2f}x"] for arm, r in arms.items()]
    table = markdown_table(["arm", "launches", "optimizer steps spent", "vs none", "wall s", "vs none"], rows)
    table += (f"\n\n{a.trials} trials of examples/ddp_mlp.py (2 ranks, {a.epochs} epochs, {a.sleep} s per step; mean "
              f"trial {none['trial_s']:.1f} s); resume and scratch: one SIGTERM per trial at 20-80% of its first "
              "attempt. Target: resume within 1.15x of none in steps.")
    save("preemption", table, {"arms": arms, "args": vars(a)},
         f"python bench/preemption.py --trials {a.trials} --epochs {a.epochs} --sleep {a.sleep}")


if __name__ == "__main__":
    main()
