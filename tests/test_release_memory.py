"""The end-of-trial memory release freezes the survivors of the first clean trial, never a trial's own objects.

``gc.freeze()`` acts on the whole process, so each case runs in a fresh Python (no pytest state frozen).
"""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc
    import torch
    from hydra_plugins.ds_optuna_sweeper._glue import _memory

    leaked = [torch.nn.Parameter(torch.zeros(3))]  # what a leaking trial leaves
    _memory.release_memory((torch.nn.Parameter,))
    print("with a parameter alive:", gc.get_freeze_count())
    leaked.clear()
    _memory.release_memory((torch.nn.Parameter,))
    frozen = gc.get_freeze_count()
    print("after a clean trial:", frozen > 1000)
    trial_objects = [torch.nn.Parameter(torch.zeros(3)) for _ in range(5)]  # built by a later trial
    print("later objects tracked:", sum(isinstance(o, torch.nn.Parameter) for o in gc.get_objects()))
    trial_objects.clear()
    _memory.release_memory((torch.nn.Parameter,))
    print("frozen once:", gc.get_freeze_count() == frozen)
""")


# Objects whose attribute access has effects: torch's deprecated ``reduce_op`` warns on every attribute read,
# and under ``-W error`` any such read fails. The release must look at each object's type only (C48: the
# FutureWarning came once per trial on rank 0, attributed to _memory.py, when it used isinstance).
UNTOUCHED = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from hydra_plugins.ds_optuna_sweeper._glue import _memory

    class Touchy:
        def __getattribute__(self, name):
            raise AssertionError(f"attribute {name!r} read")

    keep = [Touchy(), dist.reduce_op]
    print("alive:", _memory.alive((Touchy,)))
    _memory.release_memory((torch.nn.Parameter,))
    print("frozen:", _memory._FROZEN)
""")


def test_release_memory_reads_no_attribute_of_the_objects_it_walks():
    out = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", UNTOUCHED],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["alive: 1", "frozen: True"], out.stdout


def test_release_memory_freezes_once_and_only_after_a_trial_left_nothing():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "with a parameter alive: 0",  # a leak stays visible to gc.get_objects() and the C14 checks
        "after a clean trial: True",  # torch's and the test's modules, frozen
        "later objects tracked: 5",  # a later trial's objects are not frozen
        "frozen once: True",
    ], out.stdout


# A task that keeps its trial's objects in locals past the end-of-trial release (case C14's freeze, the Lightning
# example): the next trial's scope freezes them once they are gone, never before a first release, only once.
AT_NEXT_START = textwrap.dedent("""
    import gc
    import torch
    from hydra_plugins.ds_optuna_sweeper._glue import _memory

    types = (torch.nn.Parameter,)
    _memory.freeze_survivors_once(types)  # the first trial's start: nothing released yet
    print("first start:", gc.get_freeze_count())
    local = [torch.nn.Parameter(torch.zeros(3))]  # the task's local, still held when the scope ends
    _memory.release_memory(types)
    print("first end:", gc.get_freeze_count())
    local.clear()  # the task's function returned
    _memory.freeze_survivors_once(types)  # the second trial's start
    frozen = gc.get_freeze_count()
    print("second start:", frozen > 1000)
    _memory.freeze_survivors_once(types)
    print("third start:", gc.get_freeze_count() == frozen)
""")


def test_the_next_trials_start_freezes_what_a_tasks_locals_kept_alive_once():
    out = subprocess.run([sys.executable, "-c", AT_NEXT_START], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["first start: 0", "first end: 0", "second start: True", "third start: True"], \
        out.stdout
