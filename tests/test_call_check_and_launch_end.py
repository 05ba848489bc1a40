"""In-process checks of the rank-consistent call check (C34, ``_comm._arrivals``) and of the launch's end record (C41,
C45, ``_comm._launch_end``), on a real torch ``HashStore`` shared by two "ranks" running in threads.

The real worlds (torchrun, gloo, signals) are in ``tests/faults/test_skipped_calls_and_ctrl_c.py``.
"""

import signal
import threading
import time

import pytest
import torch.distributed as dist

from hydra_plugins.ds_optuna_sweeper._comm._arrivals import CallCheck
from hydra_plugins.ds_optuna_sweeper._errors import CallMismatchError, RankTimeoutError
from hydra_plugins.ds_optuna_sweeper._comm._launch_end import LaunchEnd, launch_end, record_end
from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm


def _pair(timeout_s=5.0):
    store = dist.HashStore()
    return [CallCheck(store, rank, 2, trial=3, run=1, timeout_s=timeout_s) for rank in range(2)]


def _run(fn0, fn1, limit_s=20.0):
    """Run the two ranks' functions in threads; ``{rank: exception or None}``."""
    out = {}

    def wrap(rank, fn):
        try:
            fn()
            out[rank] = None
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out[rank] = e

    threads = [threading.Thread(target=wrap, args=(r, f), daemon=True) for r, f in enumerate((fn0, fn1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit_s)
    assert not any(t.is_alive() for t in threads), "a rank still waits"
    return out


def test_the_same_calls_pass_on_every_rank_and_old_marks_are_deleted():
    checks = _pair()

    def calls(check):
        for step in range(5):
            check.before(f"report(step={step})")
            check.before("should_prune()")

    assert _run(lambda: calls(checks[0]), lambda: calls(checks[1])) == {0: None, 1: None}
    store = checks[0].store
    assert not store.check(["calls/3.1/1/report(step=0)/0"])  # two calls later every peer is past it
    assert store.check(["calls/3.1/10/should_prune()/1"])


def test_different_calls_at_the_same_position_fail_at_once_on_both_ranks_naming_both():
    checks = _pair(timeout_s=30)
    start = time.monotonic()
    out = _run(lambda: checks[0].before("report(step=3)"), lambda: checks[1].before("should_prune()"))
    assert time.monotonic() - start < 5
    for rank in (0, 1):
        assert isinstance(out[rank], CallMismatchError), out
        assert "at call #1 of the task: rank 0 report(step=3), rank 1 should_prune()" in str(out[rank])
        assert "died" not in str(out[rank])
    assert out[0].rank == 1 and out[0].call == "report(step=3)" and out[0].trial == 3


def test_a_rank_whose_task_ended_without_the_call_is_named_at_once():
    checks = _pair(timeout_s=30)

    def rank1():
        with checks[1].task():
            checks[1].before("report(step=0)")

    def rank0():
        checks[0].before("report(step=0)")
        checks[0].before("suggest_float('lr')")

    out = _run(rank0, rank1)
    assert out[1] is None
    assert isinstance(out[0], CallMismatchError)
    assert str(out[0]).startswith("rank 1 never called suggest_float('lr') in trial 3; rank 0 did (call #2 of the "
                                  "task): rank 1's task returned after 1 of these calls.")


def test_a_rank_that_never_arrives_is_named_after_rank_timeout_with_its_last_call():
    checks = _pair(timeout_s=1.5)
    start = time.monotonic()
    out = _run(lambda: (checks[0].before("should_prune()"), checks[0].before("report(step=1)")),
               lambda: checks[1].before("should_prune()"))
    waited = time.monotonic() - start
    assert isinstance(out[0], CallMismatchError) and 1.5 <= waited < 5, (out, waited)
    assert "rank 1 never called report(step=1) in trial 3 within rank_timeout=1.5 s; rank 0 did (call #2 of the " \
           "task). Rank 1 has not ended its task as far as torchrun's store knows (its last was call #1, should_prune())" \
        in str(out[0])


def test_a_label_with_the_field_separator_still_matches():
    checks = _pair()
    out = _run(lambda: checks[0].before("suggest_int('a|b')"), lambda: checks[1].before("suggest_int('a|b')"))
    assert out == {0: None, 1: None}


def test_the_first_end_record_stays_and_its_own_rank_completes_it():
    store = dist.HashStore()
    record_end(store, LaunchEnd(1, 130, "SIGINT"))
    record_end(store, LaunchEnd(0, 143, "SIGTERM"))  # another rank later: the first record stays
    record_end(store, LaunchEnd(1, 1, "KeyboardInterrupt"))  # the same rank, not ending the launch: kept too
    assert launch_end(store) == LaunchEnd(1, 130, "SIGINT")
    assert launch_end(store).signal == signal.SIGINT and launch_end(store).what == "was interrupted by SIGINT (Ctrl-C)"
    record_end(store, LaunchEnd(1, 130, "KeyboardInterrupt", 3, ended=True))  # its interrupted trial: completed
    assert launch_end(store).what == "was interrupted by SIGINT (Ctrl-C) in trial 3" and launch_end(store).ended
    assert LaunchEnd(2, 1, "ValueError: boom", 4, ended=True).what == "failed trial 4 (ValueError: boom)"
    assert LaunchEnd(2, 1, "ControlPlaneError: x").what == "stopped: ControlPlaneError: x"
    assert launch_end(None) is None
    record_end(None, LaunchEnd(0, 1, "x"))  # no store: nothing, no error


@pytest.mark.parametrize("end, expected", [
    (LaunchEnd(1, 130, "SIGINT"), "rank 0/2 stopped waiting for trial 4's trial result from all ranks on the gloo "
                                  "control group after 0.1 s: rank 1 was interrupted by SIGINT (Ctrl-C)."),
    (LaunchEnd(1, 1, "RuntimeError: injected", 4, ended=True),
     "rank 0/2 stopped waiting for trial 4's trial result from all ranks on the gloo control group after 0.1 s: "
     "rank 1 failed trial 4 (RuntimeError: injected)."),
    (None, "rank 0/2 lost the connection to rank(s) [1] after 0.1 s while waiting for trial 4's trial result from all "
           "ranks on the gloo control group (no exit recorded: killed or crashed; Connection closed by peer)"),
])
def test_a_broken_wait_says_why_from_the_end_record_never_that_a_rank_died(end, expected):
    store = dist.HashStore()
    if end is not None:
        record_end(store, end)
    ctx = RankComm(rank=0, world_size=2, timeout_s=30.0, store=store)
    error = ctx._timeout_error("trial result", 4, "all ranks", 0.1, RuntimeError("Connection closed by peer"))
    assert isinstance(error, RankTimeoutError)
    assert str(error).startswith(expected), str(error)
    assert "died" not in str(error) and "lost a peer" not in str(error)


def test_a_long_wait_at_a_call_says_so_every_note_interval_before_the_timeout(monkeypatch, caplog):
    """A peer that never reaches the call (it skipped it and sits elsewhere): the waiting rank says where it
    waits, every ``NOTE_EVERY_S`` seconds, instead of waiting ``rank_timeout`` (600 s by default) in silence
    (found by a new-user trial)."""
    from hydra_plugins.ds_optuna_sweeper._comm import _arrivals as _calls

    monkeypatch.setattr(_calls, "NOTE_EVERY_S", 0.6)
    checks = _pair(timeout_s=2.0)
    caplog.set_level("WARNING", logger=_calls.__name__)
    start = time.monotonic()
    with pytest.raises(CallMismatchError):
        checks[0].before("report(step=0)")  # rank 1 never comes
    assert time.monotonic() - start < 6
    notes = [r.getMessage() for r in caplog.records if "waits at report(step=0)" in r.getMessage()]
    assert len(notes) >= 2, notes
    assert notes[0] == ("rank 0/2 waits at report(step=0) (call #1 of trial 3's task) for 1 s: rank 1 made no such "
                        "call yet; it gives up after rank_timeout=2 s"), notes


def test_messages_name_the_host_each_rank_announced(monkeypatch):
    """Issue 42: a rank that never arrives is named with its node and address (what it announced when its world was
    set up); a rank that announced nothing is named by its number alone."""
    from hydra_plugins.ds_optuna_sweeper._comm._arrivals import announce_host, rank_on_host, ranks_on_hosts
    from hydra_plugins.ds_optuna_sweeper._comm._whoami import host_label

    store = dist.HashStore()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("GROUP_RANK", "1")
    assert host_label().startswith("node 1 (") and host_label().endswith(", 127.0.0.1)")
    announce_host(store, 1)
    assert ranks_on_hosts(store, [1, 2]) == f"[1] on {host_label()}, [2]"
    announce_host(store, 3)
    assert ranks_on_hosts(store, [3, 1]) == f"[1, 3] on {host_label()}" and rank_on_host(store, 2) == "2"
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.delenv("GROUP_RANK")
    assert "," not in host_label()  # no address to give: the host name alone
    check = CallCheck(store, 0, 2, trial=3, run=1, timeout_s=0.3)
    with pytest.raises(CallMismatchError, match=r"rank 1 on node 1 \(.*127\.0\.0\.1\) never called report"):
        check.before("report(step=0)")
