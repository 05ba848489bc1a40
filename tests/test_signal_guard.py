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
