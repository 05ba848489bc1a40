"""Start real ``torchrun`` process groups from tests, with layered timeouts and readable failures.

Every multi-process test goes through :func:`run_torchrun`, so a hang surfaces as a failed test that
prints each rank's output instead of blocking CI (see STYLE.md, "Multi-rank tests").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class TorchrunResult:
    """What one ``torchrun`` invocation left behind.

    Attributes:
        returncode: torchrun's exit status (non-zero when any rank failed).
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


def run_command(cmd: list[str], *, timeout_s: float, cwd: Path, env: dict[str, str]) -> TorchrunResult:
    """Run ``cmd`` in its own process session; on timeout kill the whole session and fail.

    Raises:
        AssertionError: if the command runs longer than ``timeout_s`` seconds (a hang); the message
            holds the output gathered so far.
    """
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(
            f"timed out after {timeout_s} s (a hang?): {' '.join(cmd)}\n--- output tail ---\n{out[-8000:]}"
        ) from None
    return TorchrunResult(proc.returncode, out, cmd)


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
        timeout_s: seconds before the whole process group is killed and the test fails.
        cwd: working directory (defaults to the repository root).
        extra_env: variables added to :func:`base_env`.
        torchrun_args: extra torchrun flags, e.g. ``["--max-restarts", "1"]``.
    """
    script_path = Path(script)
    if not script_path.is_absolute():
        script_path = REPO / script_path
    cmd = [
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
