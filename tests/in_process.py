"""Run a test app's Hydra multirun inside the pytest process, at world size 1 (issue 39, item 1).

Whatever rank 0 alone decides (budget, resume counting, warm starts, grid points, stop rules, refusals, results
files, plots, rerun lines) is the same code at world size 1 and at 8, so it is tested here as tables of inputs
and expected outputs, each sweep costing a fraction of a second instead of a torchrun launch (about 6 s on the
2-core machine: the agent and each rank import torch, Hydra and Optuna). What crosses ranks (the payload, the
agreed outcomes, signals, process deaths) keeps its real ``torchrun`` launch under ``tests/multirank`` and
``tests/faults``.

The run is the same one ``python app.py -m ...`` makes (Hydra's ``_run_hydra`` with the app's own task
function, config dir and config name), minus the process: ``sys.argv`` is set as that command would set it (the
rerun and resume lines name the script), the output of every logger goes to the result's ``output``, and what
the run changes in the process (Hydra's singletons, the root logger's handlers, the signal handlers, ``sys.argv``,
the environment, the working directory) is put back afterwards. Apps whose import-time behaviour depends on the
environment (``DSO_SPY_DIR``, ``DSO_DELAY_RANK``) still need a process of their own.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

APPS = Path(__file__).resolve().parent / "apps"
#: The signals the sweeper or the task may take over during a run; restored afterwards (SIGALRM is
#: pytest-timeout's too).
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGUSR1, signal.SIGHUP)


@dataclass
class InProcessResult:
    """What one in-process sweep left behind.

    Attributes:
        returncode: the exit status the same command would have had (``SystemExit``'s code; 0 when the run
            returned).
        output: everything the run printed or logged (stdout and stderr together).
        cmd: the argument list, as it would be typed after ``python app.py``.
    """

    returncode: int
    output: str
    cmd: list[str]

    def check(self, expected_rc: int = 0) -> "InProcessResult":
        """Raise ``AssertionError`` with the output's tail unless the exit status is ``expected_rc``."""
        if self.returncode != expected_rc:
            raise AssertionError(f"expected exit {expected_rc}, got {self.returncode} from {' '.join(self.cmd)}\n"
                                 f"--- output tail ---\n{self.output[-8000:]}")
        return self


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("text"): Python prints it and exits 1
    return 1


def _all_loggers() -> list[logging.Logger]:
    return [logging.getLogger(), *(lg for lg in list(logging.root.manager.loggerDict.values())
                                   if isinstance(lg, logging.Logger))]


@contextlib.contextmanager
def _streams_to(buffer: io.StringIO):
    """Send stdout, stderr and every stream handler to ``buffer`` for the run, then put the logging state back.

    Hydra configures logging for each run (``logging.config.dictConfig``: handlers, levels, and which loggers are
    disabled), so every logger's handlers, level, ``propagate`` and ``disabled`` flag are saved first and restored
    afterwards; otherwise one in-process sweep changes what the next prints (a warning printed twice, or not at
    all). Optuna's own handler is created first (Optuna adds it once per process, on first use), so it exists
    before the snapshot and is kept.
    """
    import optuna

    optuna.logging.get_verbosity()  # creates Optuna's library handler now, not during the run
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in _all_loggers()]
    known = {id(lg) for lg, *_ in saved}
    moved = []
    for lg, handlers, *_ in saved:
        for h in handlers:
            if type(h) is logging.StreamHandler:  # a console handler; not pytest's own capture handlers
                moved.append((h, h.setStream(buffer)))
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield
    finally:
        for h, old in moved:
            if old is not None:
                h.setStream(old)
        kept = {id(h) for _, handlers, *_ in saved for h in handlers}
        for lg in _all_loggers():
            for h in lg.handlers:
                if id(h) not in kept and not isinstance(h, logging.FileHandler):
                    with contextlib.suppress(Exception):
                        h.close()
            if id(lg) not in known:  # a logger first made during the run: back to a plain, propagating one
                lg.handlers[:] = [h for h in lg.handlers if isinstance(h, logging.FileHandler)]
        for lg, handlers, level, propagate, disabled in saved:
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate
            lg.disabled = disabled


def run_app(app: str, args: list[str], *, config_name: str, config_dir: str = "conf",
            env: dict[str, str] | None = None, cwd: Path | None = None) -> InProcessResult:
    """Run ``python tests/apps/<app>.py *args`` inside this process; see the module docstring.

    Args:
        app: the module name of a script under ``tests/apps`` whose task is a ``@hydra.main`` function
            called ``main`` (its config dir is ``config_dir``).
        args: the command-line arguments (``-m`` and the overrides).
        config_name: the app's primary config (``@hydra.main(config_name=...)``).
        config_dir: the app's config dir under ``tests/apps`` (``@hydra.main(config_path=...)``).
        env: variables set for the run only.
        cwd: working directory for the run (default: the current one).

    Returns:
        :class:`InProcessResult`; the run never raises: an error Hydra reports becomes exit status 1 with its
        message in ``output``, as on the command line.
    """
    from hydra._internal.utils import _run_hydra, get_args_parser
    from hydra.core.singleton import Singleton

    if str(APPS) not in sys.path:
        sys.path.insert(0, str(APPS))
    module = importlib.import_module(app)
    task = module.main.__wrapped__  # the function under @hydra.main
    saved = {
        "argv": sys.argv[:], "env": dict(os.environ), "cwd": os.getcwd(), "singletons": Singleton.get_state(),
        "signals": {s: signal.getsignal(s) for s in _SIGNALS},
    }
    buffer = io.StringIO()
    code = 0
    # What pytest, torch and the earlier tests left in this process is frozen for the run (``gc.freeze``: the
    # cyclic collector skips it), so the sweep's own full collections (``close_group``, ``release_memory``)
    # walk what the sweep built, as they do in a fresh ``python app.py`` process, not the test process's
    # millions of objects (0.15-0.2 s a collection here). Unfrozen afterwards, whatever the run froze too.
    gc.freeze()
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = [str(APPS / f"{app}.py"), *args]
        parser = get_args_parser()
        with _streams_to(buffer):
            try:
                _run_hydra(args=parser.parse_args(args), args_parser=parser, task_function=task,
                           config_path=str(APPS / config_dir), config_name=config_name)
            except SystemExit as exit_:
                code = _exit_code(exit_.code)
    finally:
        gc.unfreeze()
        sys.argv = saved["argv"]
        os.environ.clear()
        os.environ.update(saved["env"])
        os.chdir(saved["cwd"])
        Singleton.set_state(saved["singletons"])
        for s, handler in saved["signals"].items():
            if handler is not None:
                signal.signal(s, handler)
        from hydra_plugins.ds_optuna_sweeper._comm import _signals
        from hydra_plugins.ds_optuna_sweeper._task._slot import _reset_for_tests

        _reset_for_tests()
        _signals._exit_status_kept = False  # a refusal's SIGTERM ignore (the handlers are restored above)
    return InProcessResult(code, buffer.getvalue(), list(args))


def sweep(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None,
          plots_off: bool = True) -> InProcessResult:
    """``python sweep_app.py -m ...`` in process: the in-process twin of
    :func:`tests.multirank.sweep_helpers.run_sweep` with ``nproc=1`` (same sweep dir ``tmp_path/sweep``,
    records under ``tmp_path/records``, ``rank_timeout=30``, plots off unless an override sets them)."""
    if plots_off and not any(o.lstrip("+~").split("=")[0] == "hydra.sweeper.plots" for o in overrides):
        overrides = ("hydra.sweeper.plots=false", *overrides)
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30", *overrides]
    return run_app("sweep_app", args, config_name="app",
                   env={"DSO_RECORD_DIR": str(tmp_path / "records"), **(env or {})})
