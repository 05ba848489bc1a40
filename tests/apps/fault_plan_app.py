"""Test app for the fault launches (``tests/faults``): one torchrun launch plays a whole table of faults, one per
trial, so that each cross-rank contract costs one launch instead of one per case.

The plan is JSON in ``$DSO_FAULT_PLAN``: ``{"trials": {"<trial>": step, ...}, "calls": false}``, a step being::

    {"rank": 1, "kind": "raise", "steps": 0, "at_step": null, "others": "go_on", "leave_after_s": 3,
     "attempt": null, "then": "return"}

In its trial (and torchrun attempt, ``TORCHELASTIC_RESTART_COUNT``, when ``attempt`` is given) the task runs
``steps`` training steps (a ``dist.all_reduce`` each, on the default group); rank ``rank`` (an int or ``"all"``)
misbehaves as ``kind`` says before step ``at_step``'s all-reduce (``null``: after the last step). At that
step the other ranks either go on with the loop (``others: go_on``: they wait in an all-reduce nobody joins
when steps are left) or sleep ``leave_after_s`` and return (``leave``).

Kinds: ``raise`` (RuntimeError), ``return_nan``, ``text``, ``none_return`` (a bad return value), ``exit``
(SystemExit(3)), ``interrupt`` (KeyboardInterrupt), ``kill9`` (SIGKILL to itself), ``hang`` (sleeps an hour),
``init_group`` (an unguarded ``init_process_group``), ``destroy_group`` (``destroy_process_group`` at the end of
the task), ``skip`` (the rank-consistent call ``call`` is made by the other ranks only,
see ``calls``; ``then: collective`` sends the skipping rank into an all-reduce right after the skipped call).

``"unset_env_at": {"trial": 7, "rank": 1}``: that rank drops ``DSO_RESOLVABLE`` (set at import on every rank)
at the start of that trial's task, so that from the next trial on a config with ``${oc.env:DSO_RESOLVABLE}``
resolves on the other ranks only.

``"calls": true``: every trial reports and asks ``should_prune`` at steps 0..2 on every rank, then suggests
``lr`` (the calls of ``tests/apps/skip_call_app.py``). ``skip`` with ``call`` ``report``, ``should_prune``,
``report_and_prune`` or ``suggest`` leaves that call out on the step's rank.

Every rank writes ``$DSO_RECORD_DIR/trial<N>_rank<R>.json`` (``{"attempt", "time"}``) when its task starts,
and the misbehaving rank ``failed_trial<N>_rank<R>.json`` (``{"time"}``, its own clock) just before it
misbehaves. Each rank's exit status goes to ``$DSO_EXIT_DIR`` (``tests/apps/exit_record.py``).
"""

import json
import os
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from injected_faults import inject  # tests/apps/injected_faults.py
from hydra_plugins.ds_optuna_sweeper import current_trial

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
os.environ.setdefault("DSO_RESOLVABLE", "yes")  # see "unset_env_at"


def _plan() -> dict:
    return json.loads(os.environ.get("DSO_FAULT_PLAN", "{}"))


def _step_for(number: int) -> dict | None:
    step = _plan().get("trials", {}).get(str(number))
    if step is None or (step.get("attempt") is not None and int(step["attempt"]) != ATTEMPT):
        return None
    return step


def _all_reduce() -> None:
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))


def _misbehave(kind: str, value, out: Path, number: int):
    (out / f"failed_trial{number}_rank{RANK}.json").write_text(json.dumps({"time": time.time()}))
    return inject(kind, value, RANK)


@hydra.main(config_path="conf", config_name="fault_plan", version_base="1.3")
def main(cfg: DictConfig):
    trial = current_trial()
    number = trial.number
    out = Path(os.environ["DSO_RECORD_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"trial{number}_rank{RANK}.json").write_text(json.dumps({"attempt": ATTEMPT, "time": time.time()}))
    time.sleep(float(cfg.sleep_s))
    value = float(cfg.x) ** 2
    step = _step_for(number)
    unset = _plan().get("unset_env_at")  # {"trial", "rank"}: drop DSO_RESOLVABLE at that task's start
    if unset and int(unset["trial"]) == number and int(unset["rank"]) == RANK:
        os.environ.pop("DSO_RESOLVABLE", None)
    mine = step is not None and str(step.get("rank", 1)) in ("all", str(RANK))
    kind = step.get("kind") if step else None
    steps = int(step.get("steps", 0)) if step else 0
    at_step = step.get("at_step") if step else None
    for i in range(steps):
        if at_step is not None and i == int(at_step):
            if mine:
                value = _misbehave(kind, value, out, number)
            elif step.get("others", "go_on") == "leave":
                time.sleep(float(step.get("leave_after_s", 3)))
                return value
        _all_reduce()
    if mine and at_step is None and kind not in ("skip", "destroy_group"):
        value = _misbehave(kind, value, out, number)
    if _plan().get("calls"):
        skipping = step.get("call") if mine and kind == "skip" else None

        def skipped(call: str) -> bool:
            if skipping is not None and skipping in (call, "report_and_prune" if call in ("report", "should_prune")
                                                     else None):
                if step.get("then") == "collective":  # goes on training: waits in the next gradient all-reduce
                    _all_reduce()
                return True
            return False

        for i in range(3):
            if not skipped("report"):
                trial.report(float(cfg.x) ** 2 - 0.1 * i, i)
            if not skipped("should_prune"):
                trial.should_prune()
        if not skipped("suggest"):
            trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    if mine and kind == "destroy_group":
        import torch.distributed as dist

        (out / f"failed_trial{number}_rank{RANK}.json").write_text(json.dumps({"time": time.time()}))
        dist.destroy_process_group()
    return value


if __name__ == "__main__":
    run_recorded(main)
