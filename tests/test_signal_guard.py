"""Rank 0's signal guard (``_sweep.SigtermGuard``) in this process: what Ctrl-C does while it is active."""

import os
import signal
import time

import pytest

from hydra_plugins.ds_optuna_sweeper._comm._signals import SigtermGuard


@pytest.fixture(autouse=True)
def _sigint_handler_restored():
    saved = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, saved)


def test_ctrl_c_raises_is_remembered_and_python_handler_is_back_for_a_second_one():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt):
        with SigtermGuard() as guard:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert guard.received == signal.SIGINT  # kept for the loop, in case the exception is swallowed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_process_started_with_ctrl_c_ignored_keeps_ignoring_it():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # nohup, `cmd &`: Python itself then leaves SIGINT ignored
    with SigtermGuard() as guard:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
    assert guard.received is None
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


_REFUSING_RANK = """
import os, sys, time
from hydra_plugins.ds_optuna_sweeper._comm._refusal import quiet_exit
from hydra_plugins.ds_optuna_sweeper._comm._signals import SigtermGuard

with SigtermGuard(sigterm=sys.argv[1] == "owner"):
    try:
        print("refusing", flush=True)
        exit_ = quiet_exit(2)  # world size 2: the grace, during which the parent sends SIGTERM
    except BaseException as e:
        print("quiet_exit raised", type(e).__name__, flush=True)
        raise
print("after the guard", flush=True)
time.sleep(1.0)  # Hydra's unwinding, the study's finish: the parent's second SIGTERM lands here
raise exit_ if exit_ is not None else RuntimeError("the typed error HYDRA_FULL_ERROR=1 raises")
"""


@pytest.mark.parametrize("role", ["owner", "peer"])
@pytest.mark.parametrize("full_error", [False, True])
def test_a_refused_rank_exits_1_when_torchrun_sigterms_it_during_its_grace(tmp_path, role, full_error):
    """Every rank ends a refusal with exit 1 (docs/reference/failures.md). torchrun SIGTERMs the ranks still
    running as soon as the first exits non-zero; each rank reaches its refusal at its own moment, so a rank a
    moment behind got that SIGTERM and ended -15 (the study owner: a ``Preempted`` traceback). Now a refused
    rank ignores SIGTERM until it exits, also after the sweep's signal guard ends."""
    import subprocess
    import sys

    env = {**os.environ, "HYDRA_FULL_ERROR": "1" if full_error else "0"}
    proc = subprocess.Popen([sys.executable, "-c", _REFUSING_RANK, role], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        lines = [proc.stdout.readline()]
        assert lines[0].strip() == "refusing", lines
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)  # torchrun's stop, during the grace (or the typed error's traceback)
        lines.append(proc.stdout.readline())
        assert lines[-1].strip() == "after the guard", lines
        proc.send_signal(signal.SIGTERM)  # torchrun's SIGTERM after the guard put its handlers back
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, (proc.returncode, "".join(lines) + out)
    assert "quiet_exit raised" not in out
