"""Test app: each rank records the trial it ran to $DSO_RECORD_DIR/trial<N>_rank<R>.json.

With ``DSO_EXIT_DIR`` set, each rank also appends its own exit status to ``$DSO_EXIT_DIR/exit_rank<R>.jsonl``
(one line per process: ``{"rank", "restart", "status", "exception"}``, ``restart`` being torchrun's
``TORCHELASTIC_RESTART_COUNT``), written just before the process exits. torchrun's single exit code
says only that *some* rank failed; these lines say what each rank did. A rank killed by a signal (by
torchrun stopping the survivors, or ``kill -9``) writes no line. torchrun stops the survivors as soon
as one rank exits non-zero, so with ``DSO_EXIT_LINGER_S`` a rank that exits non-zero waits that many
seconds *after* writing its line: the other ranks' own exits (rank 0 writes results and plots first)
are then recorded too instead of being cut short by torchrun's SIGTERM.
"""

import hashlib
import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.ds_optuna_sweeper import current_trial, in_trial

RANK = int(os.environ.get("RANK", "0"))
if RANK == 0:  # lets a test build a config that resolves on rank 0 only: ${oc.env:DSO_RANK0_ONLY}
    os.environ["DSO_RANK0_ONLY"] = "yes"

# C08: start this rank later than the others, so `${now:...}` differs per rank.
if os.environ.get("DSO_DELAY_RANK") == str(RANK):
    time.sleep(float(os.environ.get("DSO_DELAY_S", "1.5")))

# C01 spy (not a mock: the real methods run): record which ranks ever open the study or ask it.
if os.environ.get("DSO_SPY_DIR"):
    import optuna

    _spy = Path(os.environ["DSO_SPY_DIR"])
    _spy.mkdir(parents=True, exist_ok=True)

    def _wrap(owner, name):
        real = getattr(owner, name)

        def spied(*args, **kwargs):
            with open(_spy / f"{name}_rank{RANK}.txt", "a") as f:
                f.write("x\n")
            return real(*args, **kwargs)

        setattr(owner, name, spied)

    _wrap(optuna.study.Study, "ask")
    _wrap(optuna, "create_study")
    _wrap(optuna, "load_study")


@hydra.main(config_path="conf", config_name="app", version_base="1.3")
def main(cfg: DictConfig) -> float:
    rank = RANK
    hc = HydraConfig.get()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    record = {
        "rank": rank,
        "seed": int(cfg.seed),
        "job_num": int(hc.job.num),
        "output_dir": hc.runtime.output_dir,
        "config": resolved,
        "config_hash": hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest(),
        "trial_number": current_trial().number if in_trial() else None,
        "trial_params": current_trial().params if in_trial() else None,
        "types": {k: type(v).__name__ for k, v in resolved.items() if not isinstance(v, dict)},
        "has_hydra_dir": (Path(hc.runtime.output_dir) / ".hydra").is_dir(),
    }
    out = Path(os.environ.get("DSO_RECORD_DIR", hc.runtime.output_dir))
    out.mkdir(parents=True, exist_ok=True)
    seed_part = f"_seed{cfg.seed}" if os.environ.get("DSO_RECORD_SEED") else ""
    (out / f"trial{hc.job.num}{seed_part}_rank{rank}.json").write_text(json.dumps(record, indent=1, default=str))
    time.sleep(float(cfg.sleep_s))
    trial = current_trial() if in_trial() else None
    if cfg.suggest:
        got = {
            "s_float": trial.suggest_float("s_float", 1e-6, 1.0, log=True),
            "s_int": trial.suggest_int("s_int", 1, 4),
            "s_cat": trial.suggest_categorical("s_cat", ["a", "b c", "1"]),
        }
        (out / f"suggest_trial{hc.job.num}_rank{rank}.json").write_text(json.dumps({k: repr(v) for k, v in got.items()}))
    value = float(cfg.x) ** 2 + float(cfg.y) + 0.1 * int(cfg.seed)
    fault = cfg.fault
    hit = fault.kind is not None and fault.rank is not None and int(fault.rank) == rank and (
        fault.trial is None or int(fault.trial) == int(hc.job.num)
    )
    if hit and fault.phase == "before":
        value = _inject(fault.kind, value)
    if int(cfg.collectives):
        import torch
        import torch.distributed as dist

        for _ in range(int(cfg.collectives)):
            t = torch.ones(1)
            dist.all_reduce(t)
    if hit and fault.phase == "after":
        value = _inject(fault.kind, value)
    for step in range(int(cfg.steps)):
        # Minimised; later trials are worse. Rank 1 reports nonsense: only rank 0's values count.
        value = 10.0 * trial.number + float(cfg.x) ** 2 - 0.1 * step
        trial.report(value if rank == 0 else -1e9, step)
        if trial.should_prune():
            (out / f"pruned_trial{hc.job.num}_rank{rank}.json").write_text(json.dumps({"step": step}))
            import optuna

            raise optuna.TrialPruned()
    if cfg.fail_on_rank is not None and int(cfg.fail_on_rank) == rank:
        if cfg.fail_on_trial is None or int(cfg.fail_on_trial) == int(hc.job.num):
            raise RuntimeError(f"injected failure on rank {rank}")
    if cfg.nan_on_rank is not None and int(cfg.nan_on_rank) == rank:
        return float("nan")
    if int(cfg.n_objectives) == 2:
        return [float(cfg.x) ** 2, float(cfg.y) - float(cfg.x)]
    return value


def _inject(kind: str, value):
    """Misbehave like real tasks do; returns the (possibly broken) objective."""
    if kind == "raise":
        raise RuntimeError(f"injected failure on rank {RANK}")
    if kind == "return_nan":
        return float("nan")
    if kind == "text":
        return "not a number"
    if kind == "none_return":
        return None
    if kind == "exit":
        raise SystemExit(3)
    if kind == "interrupt":
        raise KeyboardInterrupt()
    if kind == "kill9":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(3600)
    return value


def _exit_status(exc: BaseException | None) -> int:
    """The status the interpreter exits with when ``exc`` escapes ``main`` (``None``: returned)."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 128 + 2  # the interpreter dies of SIGINT
    return 1


def _record_exit(exc: BaseException | None) -> None:
    where = os.environ.get("DSO_EXIT_DIR")
    if not where:
        return
    line = {
        "rank": RANK,
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "status": _exit_status(exc),
        "exception": None if exc is None else type(exc).__name__,
    }
    Path(where).mkdir(parents=True, exist_ok=True)
    with open(Path(where) / f"exit_rank{RANK}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # SystemExit too: Hydra turns a task/sweeper error into SystemExit(1)
        _record_exit(e)
        if _exit_status(e) != 0:
            time.sleep(float(os.environ.get("DSO_EXIT_LINGER_S", "0")))
        raise
    _record_exit(None)
