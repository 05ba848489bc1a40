"""Rank 0: keep the sweep dir of a torchrun launch across ``--max-restarts`` restarts (case C50).

Hydra composes ``hydra.sweep.dir`` anew in every process: its default, ``multirun/${now:...}``, gave a restarted
worker group a new dir and with it a new default SQLite study, where the first study kept the closed trial's
retry WAITING forever (ashleve/lightning-hydra-template#146). Any interpolation may differ between attempts, so
the first attempt's resolved dir and resolver cache are kept in torchrun's store (which outlives the worker
restarts) under a key that carries ``TORCHELASTIC_RUN_ID``; the store is any object with torch ``Store``'s
``set``/``get``/``check``.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from .._comm import _wire

log = logging.getLogger(__name__)


def keep_sweep_dir(store: Any, config: DictConfig, attempt: int, run_id: str | None) -> str | None:
    """Make ``config.hydra.sweep.dir`` the same in every torchrun attempt of one launch.

    Called once by global rank 0, before the study is opened. Attempt 0 resolves its dir once (made absolute),
    sets it in ``config`` and records it with the resolver cache; a later attempt that finds a record sets the
    recorded dir and restores the cache, so ``${now:...}`` in the task config keeps its first value too.

    ``store``: torchrun's store (not an attempt's ``PrefixStore``), or ``None``; ``config``: changed in place;
    ``attempt``: torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``); ``run_id``: ``TORCHELASTIC_RUN_ID``.
    Returns the absolute sweep dir this attempt uses, or ``None`` when nothing could be kept (no store, or the
    store refused the call: logged as a warning; the attempt then composes its own dir).
    """
    if store is None:
        return None
    key = _wire.sweep_dir_key(run_id)
    try:
        if attempt > 0 and store.check([key]):
            record = json.loads(store.get(key))
            sweep_dir = str(record["sweep_dir"])
            with open_dict(config):
                config.hydra.sweep.dir = sweep_dir
            if record.get("cache"):
                OmegaConf.set_cache(config, pickle.loads(base64.b64decode(record["cache"])))
            log.info("torchrun restart %d: resuming in the first attempt's sweep dir %s", attempt, sweep_dir)
            return sweep_dir
        sweep_dir = str(Path(str(config.hydra.sweep.dir)).absolute())
        with open_dict(config):  # an uncached resolver would give another value at the next read
            config.hydra.sweep.dir = sweep_dir
        store.set(key, json.dumps({"sweep_dir": sweep_dir, "cache": _cache_text(config)}))
        return sweep_dir
    except Exception:
        log.warning("cannot keep the sweep dir in torchrun's store; a torchrun restart composes it again",
                    exc_info=True)
        return None


def _cache_text(config: DictConfig) -> str:
    """The config's resolver cache, pickled and base64-encoded; ``""`` when empty or not picklable."""
    cache = OmegaConf.get_cache(config)
    if not cache:
        return ""
    try:
        return base64.b64encode(pickle.dumps(dict(cache))).decode()
    except Exception:
        log.debug("the resolver cache cannot be pickled; only the sweep dir is kept", exc_info=True)
        return ""
