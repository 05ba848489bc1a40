"""Start real ``torchrun`` process groups from tests, with layered timeouts and readable failures.

Every multi-process test goes through :func:`run_torchrun`, :func:`run_python`, :func:`run_command`
or :func:`start_process`, so a hang surfaces as a failed test that prints each rank's output instead
of blocking CI (see docs/testing.md, "Multi-rank tests").

The process-lifetime rule (issue 10, item 5):

- **One deadline per test.** ``tests/conftest.py`` calls :func:`set_deadline` before each test
  starts: the test's pytest timeout minus a margin. Every run here waits
  ``min(timeout_s, seconds left before that deadline)``, so a test's sweeps *share* one budget and
  our own timeout (which prints the ranks' output) always fires before pytest's.
- **Nothing outlives its test.** ``torchrun`` starts each rank in its own session
  (``start_new_session=True`` in torch's ``SubprocessHandler``), so killing torchrun's process group
  does not reach the ranks. Every process started here therefore carries a unique
  ``DSO_TEST_PROC_TAG`` in its environment, which torchrun passes on to its ranks; :func:`kill_tree`
  kills every process of this user that carries the tag, whichever session it is in. A run's tag
  is killed when the run returns or raises (pytest-timeout's signal method raises inside the wait),
  and whatever is left when a test ends is killed by the conftest hook and at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

REPO = Path(__file__).resolve().parents[1]

#: Environment variable holding the tag that marks every process started by one run.
TAG_ENV = "DSO_TEST_PROC_TAG"
#: Seconds below which a run is not started at all: the test's deadline is as good as spent.
MIN_RUN_S = 5.0

_deadline: float | None = None  # time.monotonic() value, or None outside a pytest test
_deadline_why = ""
_live: dict[str, subprocess.Popen] = {}  # tag -> the process started with it


@dataclass
class TorchrunResult:
    """What one ``torchrun`` invocation left behind.

    Attributes:
        returncode: torchrun's exit status (non-zero when any rank failed). It says nothing about
            *which* rank failed or how: for per-rank statuses see ``tests/apps/exit_record.py``'s exit
            files (:func:`tests.multirank.sweep_helpers.exit_statuses`).
        output: stdout and stderr of torchrun and all its ranks, interleaved.
        cmd: the command line that was run.
    """

    returncode: int
    output: str
    cmd: list[str]

    def check(self, expected_rc: int = 0) -> "TorchrunResult":
        """Raise ``AssertionError`` with the tail of the output unless the exit status is ``expected_rc``."""
        if self.returncode != expected_rc:
            raise AssertionError(
                f"expected exit {expected_rc}, got {self.returncode} from {' '.join(self.cmd)}\n"
                f"--- output tail ---\n{self.output[-8000:]}"
            )
        return self


# --- the shared deadline ----------------------------------------------------------------------------


def set_deadline(seconds_from_now: float | None, why: str = "") -> None:
    """Let every run from now on end at most ``seconds_from_now`` seconds from now (``None``: no cap).

    Called by ``tests/conftest.py`` around each test with the test's pytest timeout minus a margin.
    """
    global _deadline, _deadline_why
    _deadline = None if seconds_from_now is None else time.monotonic() + seconds_from_now
    _deadline_why = why


def time_left() -> float | None:
    """Seconds left before the current test's deadline, or ``None`` when there is none."""
    return None if _deadline is None else _deadline - time.monotonic()


def allowed_seconds(timeout_s: float) -> float:
    """``min(timeout_s, time_left())``: how long the next run may last.

    Raises:
        AssertionError: if fewer than :data:`MIN_RUN_S` seconds are left, so the test fails with
            a clear message instead of starting a run pytest's timeout would cut short.
    """
    left = time_left()
    if left is None or left >= timeout_s:
        return float(timeout_s)
    if left < MIN_RUN_S:
        raise AssertionError(
            f"the test's deadline ({_deadline_why}) leaves {max(left, 0):.1f} s, too little to start another "
            "process: the runs before used up the budget (slow machine, or a hang)"
        )
    return left


# --- starting and killing processes -----------------------------------------------------------------


def _tagged_pids(tag: str) -> list[int]:
    """Pids of this user's processes whose environment holds ``DSO_TEST_PROC_TAG=tag`` (not ours)."""
    needle = f"{TAG_ENV}={tag}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or another user's process
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def _send(pids: list[int], sig: int) -> None:
    """``os.kill(pid, sig)`` for each pid; one that is gone or not ours is skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(proc: subprocess.Popen, tag: str | None = None) -> None:
    """SIGKILL ``proc``'s process group and every process that carries its tag (its ranks, in their
    own sessions, even after torchrun died and they were re-parented), all stopped first so that none sees
    another die; reaps ``proc``."""
    tag = tag or getattr(proc, "dso_tag", None)
    tagged = bool(tag) and sys.platform.startswith("linux")
    # Freeze every process first, then kill: killing torchrun alone first gives its ranks (in their own
    # sessions) the parent-death SIGTERM of ``_comm/_launcher.py``, whose handler closes the trial FAIL
    # before the second SIGKILL lands; a scheduler's or the OOM killer's SIGKILL leaves it RUNNING (C54).
    # A stopped process runs no handler; SIGKILL still ends it.
    if tagged:
        _send(_tagged_pids(tag), signal.SIGSTOP)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if tagged:
        for _ in range(50):  # a process spawned while we stopped the others: look again
            pids = _tagged_pids(tag)
            if not pids:
                break
            _send(pids, signal.SIGKILL)
            time.sleep(0.05)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    if tag:
        _live.pop(tag, None)


def kill_all_started() -> list[str]:
    """Kill every process started through this module that may still run; returns their commands."""
    left = []
    for tag, proc in list(_live.items()):
        if proc.poll() is None or _tagged_pids(tag):
            left.append(" ".join(map(str, proc.args)) if isinstance(proc.args, list) else str(proc.args))
        kill_tree(proc, tag)
    return left


atexit.register(kill_all_started)


def start_process(
    cmd: list[str], *, cwd: Path, env: dict[str, str], stdout: int | IO | None = subprocess.PIPE
) -> subprocess.Popen:
    """Start ``cmd`` in its own session with a fresh tag, registered for :func:`kill_all_started`.

    Args:
        cmd: the command line.
        cwd: working directory.
        env: the full environment (the tag is added to a copy).
        stdout: ``subprocess.PIPE`` (read it with ``communicate``) or an open file; stderr joins it.

    Returns:
        The ``Popen``; its tag is ``proc.dso_tag``. End it with :func:`wait_process` or :func:`kill_tree`.
    """
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**env, TAG_ENV: tag},
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    proc.dso_tag = tag  # type: ignore[attr-defined]
    _live[tag] = proc
    return proc


def wait_process(proc: subprocess.Popen, timeout_s: float) -> int:
    """Wait for a process from :func:`start_process` (stdout to a file), at most
    ``allowed_seconds(timeout_s)``; kill its whole tree on any way out.

    Returns:
        Its exit status.

    Raises:
        subprocess.TimeoutExpired: if it ran longer (it is killed first).
    """
    try:
        return proc.wait(timeout=allowed_seconds(timeout_s))
    finally:
        kill_tree(proc)


#: Added to :func:`base_env` by the launches that train a model and measure no memory (the main job, the HF and
#: Lightning preemption launches, C48's ZeRO-3 app, the plain example runs, the 4-rank training soak; the C14 memory
#: criteria of ``test_training_glue.py`` and ``test_lightning.py`` keep the allocators' defaults, which users
#: run). PyTorch's CPU allocator puts each tensor of 2 MiB or more on transparent huge pages
#: (``THP_MEM_ALLOC_ENABLE``, read by c10's ``alloc_cpu``), and glibc serves every allocation from its heap
#: instead of a fresh ``mmap`` that ``free`` unmaps (``MALLOC_MMAP_MAX_=0``; mallopt(3)), keeping up to 4 GiB
#: free at the heap's top (``MALLOC_TRIM_THRESHOLD_``): MiniLM's 47 MiB embedding gradient and DeepSpeed's flat
#: buffers were mapped, faulted in page by page and unmapped at every step. The main job's launch
#: (``test_main_job_sweep.py``, alone): 9.3 million page faults, 47 s user + 30 s system -> 0.6 million, 46 + 16 s.
TRAINING_ENV = {"THP_MEM_ALLOC_ENABLE": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}


def base_env(**extra: str) -> dict[str, str]:
    """Environment for a child process: one thread per rank, offline hubs, no CUDA, plus ``extra``."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",
    )
    env.update(extra)
    return env


def run_command(cmd: list[str], *, timeout_s: float, cwd: Path, env: dict[str, str],
                started: Callable[[], bool] | None = None, start_timeout_s: float = 60.0) -> TorchrunResult:
    """Run ``cmd`` in its own session for at most ``min(timeout_s, time left before the test's
    deadline)`` seconds; on any way out (timeout, an exception such as pytest-timeout's, success)
    every process it started is killed.

    Args:
        started: if given, ``timeout_s`` counts from the moment ``started()`` (polled every 0.1 s, so
            cheap: e.g. "the ranks wrote their pid files") first returns True, not from the launch, so
            a slow start on a loaded machine does not eat the time measured. The start itself may
            take ``start_timeout_s`` seconds (also capped by the test's deadline).
        start_timeout_s: see ``started``.

    Raises:
        AssertionError: if the command runs longer than that (a hang), or ``started()`` stays False
            for ``start_timeout_s`` ("did not start within"); the message holds the output so far.
    """
    limit = allowed_seconds(timeout_s if started is None else start_timeout_s)
    proc = start_process(cmd, cwd=cwd, env=env)
    try:
        try:
            out = None
            if started is not None:
                end = time.monotonic() + limit
                while out is None and not started():
                    if time.monotonic() >= end:
                        kill_tree(proc)
                        out, _ = proc.communicate()
                        raise AssertionError(f"did not start within {limit:.0f} s (start_timeout_s="
                                             f"{start_timeout_s:g}): {' '.join(cmd)}\n--- output tail ---\n{out[-8000:]}")
                    try:  # reading the pipe meanwhile, so that a chatty start cannot block on it
                        out, _ = proc.communicate(timeout=0.1)
                    except subprocess.TimeoutExpired:
                        pass
                limit = allowed_seconds(timeout_s)
            if out is None:
                out, _ = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            out, _ = proc.communicate()
            why = f"timeout_s={timeout_s:g}" if limit >= timeout_s else f"the test's deadline: {_deadline_why}"
            raise AssertionError(
                f"timed out after {limit:.0f} s ({why}; a hang?): {' '.join(cmd)}\n--- output tail ---\n{out[-8000:]}"
            ) from None
    finally:
        kill_tree(proc)
    return TorchrunResult(proc.returncode, out, cmd)


def torchrun_command(script: str | Path, args: list[str], *, nproc: int = 2,
                     torchrun_args: list[str] | None = None) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node nproc [torchrun_args] script *args``."""
    script_path = Path(script)
    if not script_path.is_absolute():
        script_path = REPO / script_path
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *(torchrun_args or []),
        str(script_path),
        *args,
    ]


def run_torchrun(
    script: str | Path,
    args: list[str],
    *,
    nproc: int = 2,
    timeout_s: float = 180,
    cwd: Path | None = None,
    extra_env: dict[str, str] | None = None,
    torchrun_args: list[str] | None = None,
) -> TorchrunResult:
    """Run ``torchrun --standalone --nproc-per-node nproc script *args`` on CPU with gloo.

    Args:
        script: the Python script to launch, relative to the repository root or absolute.
        args: arguments for the script (Hydra overrides, ``-m``).
        nproc: ranks on this machine.
        timeout_s: seconds before every process of the run is killed and the test fails; capped
            by the test's deadline (see the module docstring).
        cwd: working directory (defaults to the repository root).
        extra_env: variables added to :func:`base_env`.
        torchrun_args: extra torchrun flags, e.g. ``["--max-restarts", "1"]``.
    """
    cmd = torchrun_command(script, args, nproc=nproc, torchrun_args=torchrun_args)
    return run_command(cmd, timeout_s=timeout_s, cwd=cwd or REPO, env=base_env(**(extra_env or {})))


def run_python(
    script: str | Path, args: list[str], *, timeout_s: float = 180, cwd: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> TorchrunResult:
    """Run ``python script *args`` as one process (world size 1), with the same timeout rules."""
    script_path = Path(script)
    if not script_path.is_absolute():
        script_path = REPO / script_path
    cmd = [sys.executable, str(script_path), *args]
    return run_command(cmd, timeout_s=timeout_s, cwd=cwd or REPO, env=base_env(**(extra_env or {})))
