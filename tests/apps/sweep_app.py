"""Test app: each rank records the trial it ran to $DSO_RECORD_DIR/trial<N>_rank<R>.json.

With ``DSO_EXIT_DIR`` set, each rank process's observed exit status is appended to
``$DSO_EXIT_DIR/exit_rank<R>.jsonl`` (``tests/apps/exit_record.py``; ``DSO_EXIT_LINGER_S`` keeps a rank
that ended non-zero in the world long enough for the others' lines to be written too). torchrun's
single exit code says only that *some* rank failed; these lines say how each rank ended.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from start_barrier import wait_at_start_barrier  # tests/apps/start_barrier.py
from injected_faults import inject  # tests/apps/injected_faults.py
from hydra_plugins.ds_optuna_sweeper import current_trial, in_trial

RANK = int(os.environ.get("RANK", "0"))
if os.environ.get("DSO_TEST_SIGNAL"):  # as a terminal would start it: Ctrl-C raises, even when the test
    import signal                     # runner itself was started with SIGINT ignored (a background job)

    signal.signal(signal.SIGINT, signal.default_int_handler)
if RANK == 0:  # lets a test build a config that resolves on rank 0 only: ${oc.env:DSO_RANK0_ONLY}
    os.environ["DSO_RANK0_ONLY"] = "yes"

# C08: start this rank later than the others, so `${now:...}` differs per rank.
if os.environ.get("DSO_DELAY_RANK") == str(RANK):
    time.sleep(float(os.environ.get("DSO_DELAY_S", "1.5")))

# C01 spy (not a mock: the real methods run): record which ranks ever open a storage or a study, or ask
# it. Every entry point to the storage a rank could use is wrapped, each writing "x" per call to
# $DSO_SPY_DIR/<label>_rank<R>.txt: building any storage (RDB, journal, in-memory, or Optuna's own
# get_storage from a URL), the stale-trial check, building a Study (create_study, load_study, or
# directly), and Study.ask.
if os.environ.get("DSO_SPY_DIR"):
    import optuna

    _spy = Path(os.environ["DSO_SPY_DIR"])
    _spy.mkdir(parents=True, exist_ok=True)

    def _wrap(owner, name, label=None):
        real = getattr(owner, name)
        label = label or name

        def spied(*args, **kwargs):
            with open(_spy / f"{label}_rank{RANK}.txt", "a") as f:
                f.write("x\n")
            return real(*args, **kwargs)

        setattr(owner, name, spied)

    _wrap(optuna.study.Study, "ask")
    _wrap(optuna.study.Study, "__init__", "Study.__init__")
    _wrap(optuna, "create_study")
    _wrap(optuna, "load_study")
    for _cls in (optuna.storages.RDBStorage, optuna.storages.JournalStorage, optuna.storages.InMemoryStorage):
        _wrap(_cls, "__init__", f"{_cls.__name__}.__init__")
    _wrap(optuna.storages, "get_storage")
    _wrap(optuna.storages, "fail_stale_trials")


@hydra.main(config_path="conf", config_name="app", version_base="1.3")
def main(cfg: DictConfig) -> float:
    rank = RANK
    wait_at_start_barrier()  # DSO_START_BARRIER_DIR: groups sharing a study all start first
    hc = HydraConfig.get()
    started = time.time()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    import torch.distributed as dist

    record = {
        # what the task sees of its world (a trial group's own with hydra.sweeper.n_jobs inside torchrun)
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                               "MASTER_PORT", "DS_OPTUNA_TRIAL_GROUP")},
        "dist_world_size": dist.get_world_size() if dist.is_initialized() else None,
        "dist_rank": dist.get_rank() if dist.is_initialized() else None,
        "start": started,
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
        # hydra.sweeper.tracking: the trackers this rank imported, and the trial's tracking environment
        "trackers_imported": sorted(m for m in ("mlflow", "wandb", "tensorboard") if m in sys.modules),
        "tracking_env": {k: v for k, v in os.environ.items() if k.startswith(("MLFLOW_", "WANDB_", "TENSORBOARD_"))},
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
    hit = fault.kind is not None and fault.rank is not None and str(fault.rank) in ("all", str(rank)) and (
        fault.trial is None or int(fault.trial) == int(hc.job.num)
    ) and (fault.get("attempt") is None or int(fault.attempt) == int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    if hit and fault.phase == "before":
        value = inject(fault.kind, value, RANK)
    if int(cfg.collectives):
        import torch
        import torch.distributed as dist

        for _ in range(int(cfg.collectives)):
            t = torch.ones(1)
            dist.all_reduce(t)
    if hit and fault.phase == "after":
        value = inject(fault.kind, value, RANK)
    for step in range(int(cfg.steps)):
        # Minimised; later trials are worse. Rank 1 reports nonsense: only rank 0's values count.
        value = 10.0 * trial.number + float(cfg.x) ** 2 - 0.1 * step
        trial.report(value if rank == 0 else -1e9, step)
        if trial.should_prune():
            (out / f"pruned_trial{hc.job.num}_rank{rank}.json").write_text(json.dumps({"step": step}))
            import optuna

            raise optuna.TrialPruned()
    record["end"] = time.time()  # the trial's span on this rank (overlap of concurrent trial groups)
    (out / f"span_trial{hc.job.num}_rank{rank}.json").write_text(json.dumps({k: record[k] for k in ("start", "end")}))
    if cfg.fail_on_rank is not None and int(cfg.fail_on_rank) == rank:
        if cfg.fail_on_trial is None or int(cfg.fail_on_trial) == int(hc.job.num):
            raise RuntimeError(f"injected failure on rank {rank}")
    if cfg.nan_on_rank is not None and int(cfg.nan_on_rank) == rank:
        return float("nan")
    if int(cfg.n_objectives) == 2:
        return [float(cfg.x) ** 2, float(cfg.y) - float(cfg.x)]
    return value


if __name__ == "__main__":
    run_recorded(main)
