"""How this run was launched, as a line a user can paste into a shell (resume hints, rerun lines).

A torchrun worker does not see torchrun's own command line; it sees torchrun's environment
(``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``, ``TORCHELASTIC_RUN_ID``; torch.distributed.run documentation)
and its own ``sys.argv`` (the script and Hydra's arguments, ``--config-name`` included).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import Sequence


def launcher() -> list[str]:
    """The launcher part: ``["torchrun", "--standalone", "--nproc_per_node", "2"]`` under torchrun on one
    node, ``["torchrun", "--nnodes", "N", "--nproc_per_node", "L"]`` on several (add your rendezvous
    flags), or the Python interpreter (``python`` when that is the one on ``PATH``)."""
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None and os.environ.get("LOCAL_WORLD_SIZE"):
        local = int(os.environ["LOCAL_WORLD_SIZE"])
        world = int(os.environ.get("WORLD_SIZE", local))
        if world == local:
            return ["torchrun", "--standalone", "--nproc_per_node", str(local)]
        return ["torchrun", "--nnodes", str(world // max(local, 1)), "--nproc_per_node", str(local)]
    found = shutil.which("python")
    if found and os.path.realpath(found) == os.path.realpath(sys.executable):
        return ["python"]
    return [_relative(sys.executable)]


def app_arguments(extra: Sequence[str] = ()) -> list[str]:
    """The script (relative to the working directory) and its arguments, with each ``key=value`` of
    ``extra`` replacing an argument of the same key or appended."""
    argv = list(sys.argv) if sys.argv and sys.argv[0] else ["<your app>.py"]
    script, args = _relative(argv[0]), argv[1:]
    keys = {e.split("=", 1)[0] for e in extra}
    kept = [a for a in args if a.split("=", 1)[0] not in keys]
    return [script, *kept, *extra]


def command_line(extra: Sequence[str] = ()) -> str:
    """:func:`launcher` + :func:`app_arguments`, shell-quoted, on one line."""
    return shlex.join([*launcher(), *app_arguments(extra)])


def resume_command(sweep_dir: str) -> str:
    """The exact command that continues this sweep's study: the same launcher and arguments, with
    ``hydra.sweep.dir`` pinned to this run's sweep dir (a ``${now:...}`` default would start a new
    dir, and with the default storage a new study; case C23)."""
    return command_line([f"hydra.sweep.dir={sweep_dir}"])


def _relative(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path
