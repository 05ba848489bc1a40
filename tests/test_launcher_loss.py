"""C55 in process: what a worker knows about its torchrun agent (``_comm/_launcher.py``). The real
``kill -9`` of torchrun is ``tests/faults/test_torchrun_restart_and_agent_loss.py``; here a real child process plays the
agent, and a real TCPStore plays its store."""

import gc
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch.distributed as dist

from hydra_plugins.ds_optuna_sweeper._comm import _launcher


@pytest.fixture(autouse=True)
def _fresh_module_state(monkeypatch):
    monkeypatch.setattr(_launcher, "_watched_parent", None)
    monkeypatch.setattr(_launcher, "_lost", False)
    monkeypatch.setattr(_launcher, "_agent_address", None)


def test_outside_torchrun_nothing_is_set_and_no_store_is_probed(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert _launcher.die_with_launcher() is False
    assert not _launcher.launcher_gone() and not _launcher.store_is_gone()


def test_the_store_check_follows_the_agents_store_not_a_trial_groups(monkeypatch):
    """The address is taken when the sweep starts; trial groups rewrite MASTER_PORT later."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setattr(_launcher, "_prctl", lambda option, arg: 0)  # keep pytest's own death signal unset
    monkeypatch.setattr(_launcher, "_death_signal", lambda: 0)
    _launcher.die_with_launcher()
    monkeypatch.setenv("MASTER_PORT", "1")  # a trial group's own store (nothing listens there)
    assert not _launcher.store_is_gone()
    del server
    gc.collect()
    assert _launcher.store_is_gone()
    _launcher.stop_watching()
    assert not _launcher.store_is_gone()  # after the search nothing is probed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_gets_sigterm_when_its_parent_dies(tmp_path):
    """A real parent (the agent's stand-in) starts a worker that calls die_with_launcher, then the parent is
    SIGKILLed: the worker's SIGTERM handler sees launcher_gone() and records it."""
    out = tmp_path / "worker.txt"
    worker = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from hydra_plugins.ds_optuna_sweeper._comm import _launcher
        def on_term(signum, frame):
            open({str(out)!r}, "w").write(f"SIGTERM gone={{_launcher.launcher_gone()}}")
            os._exit(0)
        signal.signal(signal.SIGTERM, on_term)
        assert _launcher.die_with_launcher()
        open({str(out)!r} + ".ready", "w").close()
        time.sleep(30)
    """)
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", {worker!r}], env={{**__import__("os").environ,
                         "TORCHELASTIC_RUN_ID": "t"}})
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        for _ in range(300):
            if (tmp_path / "worker.txt.ready").exists():
                break
            time.sleep(0.1)
        proc.kill()
        proc.wait(timeout=10)
        for _ in range(100):
            if out.exists() and out.read_text():
                break
            time.sleep(0.1)
    finally:
        proc.kill()
    assert out.read_text() == "SIGTERM gone=True"
