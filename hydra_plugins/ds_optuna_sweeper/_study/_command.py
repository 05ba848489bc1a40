"""How this run was launched, as a line a user can paste into a shell (resume hints, rerun lines), rebuilt from
torchrun's environment (a worker never sees torchrun's own command line) and ``sys.argv``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .._comm._whoami import LAUNCH_WORLD_ENV
from .._task._replayed import REPLAY_ENV
from ._override_text import literal_value, override_line
from ._stored import FIXED_OVERRIDES_ATTR, OVERRIDE_PARAMS_ATTR

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from ._search_space import SearchSpace


def launcher(*, rerun: bool = False) -> list[str]:
    """The launcher part of a command line: under torchrun :func:`_torchrun_words` (with trial groups a resume line
    names the launch's world, a rerun line the group's); else ``python`` (or this interpreter's path), or with
    ``rerun`` ``torchrun --standalone --nproc_per_node 1``: the sweep ran every trial with torchrun's variables
    set, which a task's ``init_process_group()`` (env://) needs.
    """
    launch_world = os.environ.get(LAUNCH_WORLD_ENV)
    if launch_world and not rerun:
        world, local = (int(v) for v in launch_world.split("/"))
        return _torchrun_words(world, local)
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None and os.environ.get("LOCAL_WORLD_SIZE"):
        local = int(os.environ["LOCAL_WORLD_SIZE"])
        world = int(os.environ.get("WORLD_SIZE", local))
        return _torchrun_words(world, local)
    if rerun:
        return [*_torchrun(), "--standalone", "--nproc_per_node", "1"]
    return [_python()]


def _torchrun_words(world: int, local: int) -> list[str]:
    """``torchrun --standalone --nproc_per_node L`` (one node) or ``torchrun --nnodes N --nproc_per_node L`` (add
    your rendezvous flags)."""
    if world == local:
        return [*_torchrun(), "--standalone", "--nproc_per_node", str(local)]
    return [*_torchrun(), "--nnodes", str(world // max(local, 1)), "--nproc_per_node", str(local)]


def _torchrun() -> list[str]:
    """``torchrun`` when it is this environment's entry point on ``PATH``, else ``<python> -m torch.distributed.run``."""
    found = shutil.which("torchrun")
    # The directories are compared, not the files' targets: a venv's python is a symlink to the base
    # interpreter, while its torchrun is a script in the venv's own bin directory.
    same_env = found and os.path.realpath(os.path.dirname(found)) == os.path.realpath(os.path.dirname(sys.executable))
    return ["torchrun"] if same_env else [_python(), "-m", "torch.distributed.run"]


def _python() -> str:
    found = shutil.which("python")
    if found and os.path.realpath(found) == os.path.realpath(sys.executable):
        return "python"
    return _relative(sys.executable)


#: Hydra's command-line flags that choose the primary config (hydra/_internal/utils.py get_args_parser).
CONFIG_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")


def config_flags() -> list[str]:
    """Hydra's ``--config-path/--config-name/--config-dir`` flags (and short forms) as given."""
    args, out, i = list(sys.argv[1:]), [], 0
    while i < len(args):
        arg = args[i]
        if arg in CONFIG_FLAGS and i + 1 < len(args):
            out += [arg, args[i + 1]]
            i += 2
            continue
        if arg.split("=", 1)[0] in CONFIG_FLAGS and "=" in arg:
            out.append(arg)
        i += 1
    return out


#: Hydra overrides that belong to the sweep, not to a single run of one config.
SWEEP_ONLY_OVERRIDES = ("hydra.sweep", "hydra/sweeper", "hydra.sweeper", "hydra.mode", "hydra/launcher",
                        "hydra.launcher", "hydra.output_subdir", "hydra.job_logging.handlers.file.filename")


def rerun_line(task_overrides: Sequence[str], hydra_overrides: Sequence[str] = (), env: dict[str, str] | None = None,
               run_dir: str | None = None) -> str:
    """One shell line that runs one config the way the sweep ran its trials (case C19):
    ``[NAME=value ...] <launcher> <script> <config flags> <hydra overrides> <task overrides>``, shell-quoted.
    The sweep's own ``hydra.*`` overrides are dropped; ``env`` is written ``NAME='value'`` before the command
    (``DS_OPTUNA_TRIAL`` for params suggested inside the task); ``run_dir`` as ``hydra.run.dir=<run_dir>``
    unless set, so every rank writes into one dir (Hydra's default has a timestamp per rank, case C49).
    """
    script = app_arguments()[0]
    kept = [o for o in hydra_overrides if not o.lstrip("+~").startswith(SWEEP_ONLY_OVERRIDES)]
    if run_dir and not any(o.lstrip("+~").startswith("hydra.run.dir=") for o in kept):
        kept.append(f"hydra.run.dir={literal_value(run_dir)}")
    words = shlex.join([*launcher(rerun=True), script, *config_flags(), *kept, *task_overrides])
    prefix = " ".join(f"{name}={shlex.quote(value)}" for name, value in (env or {}).items())
    return f"{prefix} {words}" if prefix else words


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
    ``hydra.sweep.dir`` pinned (a ``${now:...}`` default would start a new dir and study; case C23). On several
    nodes a shell comment asks for the rendezvous flags, which the ranks never see."""
    line = command_line([f"hydra.sweep.dir={literal_value(sweep_dir)}"])
    if "--nnodes" in launcher():
        line += "  # on every node, with your rendezvous flags: --rdzv-backend c10d --rdzv-endpoint <host>:<port> --rdzv-id <a new id>"
    return line


def restart_pending() -> tuple[int, int] | None:
    """``(next restart, max restarts)`` when torchrun will restart this group after it exits non-zero
    (``TORCHELASTIC_RESTART_COUNT`` below ``TORCHELASTIC_MAX_RESTARTS``, both set by torchrun in every worker),
    else ``None`` (not under torchrun, or no restart left)."""
    try:
        count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        most = int(os.environ["TORCHELASTIC_MAX_RESTARTS"])
    except (KeyError, ValueError):
        return None
    return (count + 1, most) if count < most else None


def resume_advice(sweep_dir: str) -> str:
    """"Resume the study with:" and :func:`resume_command` on a line of its own; when torchrun restarts the group
    by itself (:func:`restart_pending`) the text says so first, so that nobody starts a second launch meanwhile."""
    pending = restart_pending()
    before = "" if pending is None else (f"torchrun restarts the group now (restart {pending[0]} of {pending[1]}, "
                                          "--max-restarts) and the restarted group resumes the study by itself; "
                                          "only if it does not, ")
    return f"{before}Resume the study with:\n{resume_command(sweep_dir)}"


def _relative(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


# --- A stored trial's rerun line (the results file, refit) -----------------------------------------


@dataclass(frozen=True)
class RerunContext:
    """What a rerun line needs besides the trial: the search ``space``, the sweep's ``hydra.*`` command-line
    overrides, and the ``sweep_dir`` whose ``rerun/<trial>`` the line runs in (``""``: Hydra's default)."""

    space: "SearchSpace | None"
    hydra_overrides: tuple[str, ...] = ()
    sweep_dir: str = ""


def split_params(trial: "FrozenTrial", space: "SearchSpace | None") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(override params, task params)``: params that are config overrides (the search space's and
    those ``custom_search_space`` added) and params the task suggested itself (``suggest_*``)."""
    names = set(space.params) if space is not None else set(trial.params)
    names |= set(trial.user_attrs.get(OVERRIDE_PARAMS_ATTR, ()))
    overrides = {k: v for k, v in trial.params.items() if k in names}
    return overrides, {k: v for k, v in trial.params.items() if k not in names}


def trial_overrides(trial: "FrozenTrial", space: "SearchSpace | None") -> tuple[list[str], dict[str, Any]]:
    """``(override lines, task params)`` that reproduce ``trial``: the fixed overrides of the run that
    asked it (stored with the trial; the current run's for trials stored without them), then its
    params that are overrides; and the params the task suggested itself."""
    override_params, task_params = split_params(trial, space)
    if space is None:
        return [override_line(k, v) for k, v in override_params.items()], task_params
    fixed = trial.user_attrs.get(FIXED_OVERRIDES_ATTR, space.fixed)
    return [*fixed, *space.param_lines(override_params)], task_params


def trial_entry(trial: "FrozenTrial", ctx: RerunContext) -> dict[str, Any]:
    """One trial for ``optimization_results.yaml``: number, values, params, overrides and ``rerun_command``
    (params the task suggested itself travel in ``DS_OPTUNA_TRIAL``, which ``current_trial()`` replays; C19)."""
    overrides, _ = trial_overrides(trial, ctx.space)
    return {
        "number": trial.number,
        "values": list(trial.values),
        "params": dict(trial.params),
        "overrides": overrides,
        "override_line": " ".join(shlex.quote(o) for o in overrides),
        "rerun_command": trial_rerun_line(trial, ctx),
    }


def trial_rerun_line(trial: "FrozenTrial", ctx: RerunContext) -> str:
    """The rerun line of a stored trial (any state): see :func:`trial_entry`."""
    overrides, task_params = trial_overrides(trial, ctx.space)
    env = {REPLAY_ENV: json.dumps({"number": trial.number, "params": task_params})} if task_params else None
    return rerun_line(overrides, ctx.hydra_overrides, env,
                      run_dir=rerun_dir(ctx.sweep_dir, trial.number) if ctx.sweep_dir else None)


def rerun_dir(sweep_dir: str, number: int | str, *, refit: bool = False) -> str:
    """Where a rerun line runs: ``<sweep dir>/rerun/<trial>`` (a refit's: ``<sweep dir>/rerun/refit-<trial>``, a
    refit baseline's ``<sweep dir>/rerun/refit-<name>``), one dir for every rank (case C49)."""
    return str(Path(sweep_dir) / "rerun" / (f"refit-{number}" if refit else str(number)))
