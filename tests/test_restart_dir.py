"""C50: the sweep dir a torchrun launch keeps across ``--max-restarts`` restarts (``_loop/_sweep.keep_sweep_dir``),
with a real torch store and real OmegaConf resolvers: whatever composed the dir, a restarted attempt uses the
first attempt's resolved dir; the real torchrun case is ``tests/faults/test_torchrun_restart_and_agent_loss.py``."""

import itertools
import os
from pathlib import Path

import pytest
import torch.distributed as dist
from omegaconf import OmegaConf

from hydra_plugins.ds_optuna_sweeper._comm._wire import sweep_dir_key
from hydra_plugins.ds_optuna_sweeper._loop._sweep import keep_sweep_dir

_counter = itertools.count()
if not OmegaConf.has_resolver("h1_test_next"):  # a user's own resolver, uncached: a new value per call
    OmegaConf.register_new_resolver("h1_test_next", lambda: str(next(_counter)), use_cache=False)
if not OmegaConf.has_resolver("h1_test_random"):
    OmegaConf.register_new_resolver("h1_test_random", lambda: os.urandom(4).hex())
if not OmegaConf.has_resolver("now"):  # Hydra registers it when an app starts; the same resolver as Hydra's
    from hydra.core.utils import setup_globals

    setup_globals()


def _config(sweep_dir: str):
    return OmegaConf.create({"hydra": {"sweep": {"dir": sweep_dir}}, "task": {"stamp": "${now:%H-%M-%S-%f}"}})


@pytest.mark.parametrize("recipe", [
    "multirun/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}",  # Hydra's default, to the microsecond
    "runs/${oc.env:H1_TEST_RUN}",                   # an environment variable that changes between attempts
    "runs/${h1_test_next:}",                        # a user's own resolver, uncached
    "runs/${h1_test_random:}",                      # a random one
    "/abs/plain",                                   # no interpolation
], ids=["now", "oc.env", "own-resolver", "random", "plain"])
def test_a_restarted_attempt_uses_the_first_attempts_resolved_dir(recipe, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("H1_TEST_RUN", "first")
    store = dist.HashStore()
    first = _config(recipe)
    stamp = first.task.stamp  # resolved before the sweep starts (Hydra resolves its config at start-up)
    kept = keep_sweep_dir(store, first, 0, "run-a")
    assert kept == first.hydra.sweep.dir and Path(kept).is_absolute()  # read once, then pinned

    monkeypatch.setenv("H1_TEST_RUN", "second")
    restarted = _config(recipe)  # a fresh process composes the recipe again
    assert keep_sweep_dir(store, restarted, 1, "run-a") == kept
    assert restarted.hydra.sweep.dir == kept
    assert restarted.task.stamp == stamp  # the resolver cache came back: ${now} in the task config too


def test_another_launch_or_the_first_attempt_keeps_its_own_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = dist.HashStore()
    keep_sweep_dir(store, _config("a"), 0, "run-a")
    other = _config("b")
    assert keep_sweep_dir(store, other, 1, "run-b") == str(tmp_path / "b")  # no record of run-b: its own dir
    again = _config("c")
    assert keep_sweep_dir(store, again, 0, "run-a") == str(tmp_path / "c")  # attempt 0 always records its own
    assert store.get(sweep_dir_key("run-a")).decode().find(str(tmp_path / "c")) >= 0


def test_without_a_store_nothing_changes():
    cfg = _config("multirun/${now:%H}")
    assert keep_sweep_dir(None, cfg, 1, "run-a") is None
    assert OmegaConf.to_container(cfg.hydra)["sweep"]["dir"] == "multirun/${now:%H}"


def test_a_store_that_refuses_is_logged_and_the_attempt_composes_its_own(caplog):
    """torchrun's store after its agent died: a real TCPStore client whose server is gone."""
    import gc
    from datetime import timedelta

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=2))
    del server
    gc.collect()
    cfg = _config("x")
    assert keep_sweep_dir(client, cfg, 1, "run-a") is None
    assert cfg.hydra.sweep.dir == "x"
    assert "cannot keep the sweep dir" in caplog.text


def test_an_unpicklable_resolver_cache_keeps_the_dir_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if not OmegaConf.has_resolver("h1_test_lock"):
        import threading

        OmegaConf.register_new_resolver("h1_test_lock", lambda: threading.Lock())
    store = dist.HashStore()
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": "d"}}, "lock": "${h1_test_lock:}"})
    cfg.lock  # noqa: B018 (fills the cache with an object pickle refuses)
    assert keep_sweep_dir(store, cfg, 0, "run-a") == str(tmp_path / "d")
    restarted = _config("other")
    assert keep_sweep_dir(store, restarted, 1, "run-a") == str(tmp_path / "d")
