"""The path of one trial through the package, measured by running it: issue 40's measure "one trial at n_jobs=1
from sweep() to tell: at most 10 stops in the control plane, at most 2 climbs back up".

An in-process Hydra multirun of a trivial task (``x ** 2``, three trials, world size 1, ``n_jobs=1``, the
default SQLite storage, plots off) runs under :func:`sys.setprofile` on the main thread (threads of ours, such as
the storage heartbeat, are not followed). Every ``call`` event whose callee is a function of the package
``hydra_plugins.ds_optuna_sweeper`` is recorded; calls into other libraries are not, but package code they
call back (the task wrapper Hydra's launcher runs, a ``@contextmanager`` generator resumed by ``contextlib``, a
logging filter) is, and its caller is the nearest package frame below it on the stack (the library in between
is noted as "via").

The round: ONE trial in the middle of the sweep (trial 1 by default), from the moment the loop
(``_loop/_sweep.py``, ``Sweep._loop``) calls its study handle's ``next_command`` (the code that asks the trial)
to the moment the handle's ``tell`` of that round returns. A second column, "whole iteration", also counts what
the loop does between the previous round's ``tell`` and this round's ask (the timer, the signal check), so
that each call of the loop is counted once per trial.

Definitions (module = one ``.py`` file of the package; the counts are over the round, in call order):

- control plane: the modules of ``_comm/``, ``_loop/``, ``_study/``, ``_task/`` and of the package root;
  ``_glue/`` and ``_tracking/`` (the user-facing glue) are left out, and calls into or out of them are counted
  apart ("glue crossings");
- a stop: a call from a function of control-plane module A into a function of a different control-plane
  module B (each call counts, a resumed generator too; "stops, generators resumed not counted" leaves those
  out); "modules visited": the distinct control-plane modules with a function that ran in the round, the
  loop's ``_loop/_sweep.py`` included;
- a climb back up: a stop from a lower layer into a higher one. The layers are docs/design.md's "Which folder
  may import which", from the bottom up: the root's modules (``_errors``, ``_upstream``, ``_settings`` and the
  rest) < ``_comm`` < ``_task`` < ``_study`` < ``_loop`` < the root's doors down (``__init__``, the public
  API, ``sweeper`` and ``config``). Modules of one folder share a layer;
- a return: control coming back from B to A at the end of a stop's call (or a generator's yield); every call
  of the round returns inside it, so returns equal stops and are printed only as a check.

Usage (the project's venv; against another tree, put it first on ``PYTHONPATH``: the package is imported
normally, and the script needs nothing else of the tree)::

    python bench/trial_path.py              # the tables
    python bench/trial_path.py --list       # ... and every crossing of the round, in call order
    python bench/trial_path.py --json       # the figures as one JSON object

Exit status 0 always: the figures are a measure, not a gate (issue 40's targets: stops <= 10, climbs <= 2).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

PACKAGE = "hydra_plugins.ds_optuna_sweeper"
LOOP_MODULE = PACKAGE + "._loop._sweep"
#: control-plane folders (a root module is in the control plane too)
CONTROL_FOLDERS = ("_comm", "_loop", "_study", "_task")
GLUE_FOLDERS = ("_glue", "_tracking")
#: the layers of docs/design.md, "Which folder may import which", bottom up
LAYERS = {".": 0, "_comm": 1, "_task": 2, "_study": 3, "_loop": 4, "doors": 5}
DOORS = ("", "sweeper", "config")  # the package's __init__ (short name ""), sweeper.py, config.py
TARGETS = {"stops": 10, "climbs": 2}
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR


def short(module: str) -> str:
    """``hydra_plugins.ds_optuna_sweeper._loop._sweep`` -> ``_loop._sweep``; the package itself -> ``__init__``."""
    if module == PACKAGE:
        return "__init__"
    return module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else module


def folder(module: str) -> str:
    """``_loop`` for ``_loop._sweep`` (and for ``_loop/__init__.py``), ``doors`` for the root's doors down, ``.`` for
    the root's other modules."""
    rest = module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else ""
    first = rest.split(".")[0]
    if first in DOORS:
        return "doors"
    if first.startswith("_") and (first in CONTROL_FOLDERS or first in GLUE_FOLDERS or first in ("_conf",)):
        return first
    return "."


def in_package(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def control_plane(module: str) -> bool:
    return in_package(module) and folder(module) not in GLUE_FOLDERS


@dataclass
class Crossing:
    """One call from package module ``caller`` into another package module ``callee``."""

    caller: str  # short module names
    caller_func: str
    callee: str
    callee_func: str
    via: str  # the library between them ("" for a direct call)
    resumed: bool  # a generator resumed, not a new call
    step: str  # the loop's step it belongs to (the function the loop called)
    in_round: bool  # inside the ask-to-tell round (else: the loop's part before the ask)
    stop: bool  # both modules in the control plane
    climb: bool

    def text(self) -> str:
        via = f" (via {self.via})" if self.via else ""
        resumed = " [resumed]" if self.resumed else ""
        return f"{self.caller}.{self.caller_func} -> {self.callee}.{self.callee_func}{via}{resumed}"


def _qualname(code, frame=None) -> str:
    """``Class.method``; a dataclass's generated ``__init__`` (``__create_fn__.<locals>.__init__``) as
    ``TheClass.__init__``."""
    name = getattr(code, "co_qualname", code.co_name)
    if "__create_fn__" in name and frame is not None and "self" in frame.f_locals:
        return f"{type(frame.f_locals['self']).__name__}.{code.co_name}"
    return name


def _module_of(frame) -> str:
    return frame.f_globals.get("__name__", "") or ""


class _Recorder:
    """The profile function: finds the loop's frame, opens the windows, records the package's crossings."""

    def __init__(self, trial: int) -> None:
        self.trial = trial
        self.loop_frame = None
        self.asks = 0  # next_command calls made by the loop
        self.tells = 0  # tell returns seen by the loop
        self.iteration_open = trial == 0  # trial 0 has no previous tell: its iteration starts with the loop
        self.round_open = False
        self.done = False
        self.asked: list[int] | None = None
        self.crossings: list[Crossing] = []
        self.calls = 0  # every call into a package function in the iteration
        self.calls_in_round = 0
        self.visited: set[str] = set()
        self.visited_in_round: set[str] = set()
        self.open_crossings: dict[int, tuple[Any, bool]] = {}  # id(frame) -> (frame, in_round)
        self.returns = 0
        self.returns_in_round = 0
        self._generators: list[Any] = []  # generator frames seen in the window (kept alive: ids stay unique)
        self._generator_ids: set[int] = set()

    def __call__(self, frame, event, arg):
        if event == "call":
            self._call(frame)
        elif event == "return":
            self._return(frame, arg)

    def _is_loop(self, frame) -> bool:
        return frame is not None and frame.f_code.co_name == "_loop" and _module_of(frame) == LOOP_MODULE

    def _call(self, frame) -> None:
        if self.done:
            return
        module = _module_of(frame)
        if not in_package(module):
            return
        back = frame.f_back
        if self.loop_frame is None:
            if self._is_loop(back):
                self.loop_frame = back
            else:
                return
        if back is self.loop_frame and frame.f_code.co_name == "next_command":
            if self.asks == self.trial:
                self.round_open = True
            self.asks += 1
        if self.iteration_open:
            self._record(frame, module)

    def _record(self, frame, module: str) -> None:
        code = frame.f_code
        resumed = False
        if code.co_flags & _GENERATOR_FLAGS:
            resumed = id(frame) in self._generator_ids
            if not resumed:
                self._generator_ids.add(id(frame))
                self._generators.append(frame)
        self.calls += 1
        self.visited.add(module)
        if self.round_open:
            self.calls_in_round += 1
            self.visited_in_round.add(module)
        # the nearest package frame below the callee, and the library in between
        caller, via, chain = frame.f_back, "", []
        while caller is not None and caller is not self.loop_frame and not in_package(_module_of(caller)):
            via = via or _module_of(caller)
            chain.append(caller)
            caller = caller.f_back
        if caller is None:
            return
        caller_module = _module_of(caller)
        if caller_module == module:
            return
        stop = control_plane(caller_module) and control_plane(module)
        climb = stop and LAYERS[folder(caller_module)] < LAYERS[folder(module)]
        self.crossings.append(Crossing(short(caller_module), _qualname(caller.f_code, caller), short(module),
                                       _qualname(code, frame), via, resumed, self._step(frame), self.round_open, stop,
                                       climb))
        if stop:
            self.open_crossings[id(frame)] = (frame, self.round_open)

    def _step(self, frame) -> str:
        """The loop's step: the outermost package function (not a comprehension) under the loop's frame."""
        chain = []
        f = frame
        while f is not None and f is not self.loop_frame:
            chain.append(f)
            f = f.f_back
        if f is None:
            return "?"
        for f in reversed(chain):
            if in_package(_module_of(f)) and not f.f_code.co_name.startswith("<"):
                return _qualname(f.f_code, f)
        return _qualname(frame.f_code, frame)

    def _return(self, frame, arg) -> None:
        if self.done or self.loop_frame is None:
            return
        if id(frame) in self.open_crossings and self.open_crossings[id(frame)][0] is frame:
            _, in_round = self.open_crossings.pop(id(frame))
            self.returns += 1
            self.returns_in_round += in_round
        if frame.f_back is not self.loop_frame:
            return
        name = frame.f_code.co_name
        if name == "next_command" and self.round_open and self.asked is None:
            self.asked = [p.number for p in getattr(arg, "payloads", ()) or ()]
        elif name == "tell":
            self.tells += 1
            if self.round_open:
                self.done = True
            elif self.tells == self.trial:
                self.iteration_open = True


def measure(run: Callable[[], Any], trial: int = 1) -> dict:
    """Run ``run()`` (an in-process sweep of more than ``trial`` trials) and measure round ``trial`` (0-based: the
    loop's ``trial``-th ask); every figure as one JSON-ready dict.

    The profile function is set while ``Sweep._loop`` runs (the method is wrapped for the run, then put back), so
    that Hydra's set-up and the first imports are not slowed down by it; the wrapper is not package code and adds
    no crossing.

    Raises:
        RuntimeError: the sweep never reached that round's tell (too few trials, or the loop has changed).
    """
    recorder = _Recorder(trial)
    sweep_module = importlib.import_module(LOOP_MODULE)
    loop = sweep_module.Sweep._loop

    @functools.wraps(loop)
    def profiled_loop(*args: Any, **kwargs: Any) -> Any:
        previous = sys.getprofile()
        sys.setprofile(recorder)
        try:
            return loop(*args, **kwargs)
        finally:
            sys.setprofile(previous)

    sweep_module.Sweep._loop = profiled_loop  # the profile runs while the loop runs, not during Hydra's set-up
    try:
        run()
    finally:
        sweep_module.Sweep._loop = loop
    if not recorder.done:
        raise RuntimeError(f"the sweep never told round {trial} (loop frame found: {recorder.loop_frame is not None}, "
                           f"asks: {recorder.asks}, tells: {recorder.tells})")
    return _figures(recorder)


def _counts(crossings: list[Crossing], visited: set[str], calls: int, returns: int) -> dict:
    stops = [c for c in crossings if c.stop]
    cp_visited = sorted({short(m) for m in visited if control_plane(m)} | {short(LOOP_MODULE)})
    return {
        "stops": len(stops),
        "stops_without_resumed_generators": sum(not c.resumed for c in stops),
        "stops_via_a_library": sum(bool(c.via) for c in stops),
        "distinct_module_pairs": len({(c.caller, c.callee) for c in stops}),
        "distinct_function_pairs": len({(c.caller, c.caller_func, c.callee, c.callee_func) for c in stops}),
        "climbs": sum(c.climb for c in stops),
        "returns": returns,
        "modules_visited": len(cp_visited),
        "folders_visited": len({folder(PACKAGE + "." + m) for m in cp_visited}),
        "glue_crossings": sum(not c.stop for c in crossings),
        "package_calls": calls,
        "modules": cp_visited,
    }


def _figures(r: _Recorder) -> dict:
    in_round = [c for c in r.crossings if c.in_round]
    stops = [c for c in in_round if c.stop]
    entered = Counter(c.callee for c in stops)
    left = Counter(c.caller for c in stops)
    top = sorted(set(entered) | set(left), key=lambda m: (-(entered[m] + left[m]), m))[:5]
    return {
        "trial": r.trial,
        "asked": r.asked,
        "round": _counts(in_round, r.visited_in_round, r.calls_in_round, r.returns_in_round),
        "iteration": _counts(r.crossings, r.visited, r.calls, r.returns),
        "top_modules": [{"module": m, "entered": entered[m], "left": left[m],
                         "climbs_into": sum(c.climb and c.callee == m for c in stops)} for m in top],
        "top_pairs": [{"pair": f"{a} -> {b}", "stops": n}
                      for (a, b), n in Counter((c.caller, c.callee) for c in stops).most_common(8)],
        "by_step": dict(Counter(c.step for c in stops)),
        "by_library": dict(Counter(c.via.split(".")[0] for c in stops if c.via)),
        "climbs": [c.text() for c in stops if c.climb],
        "crossings": [asdict(c) | {"text": c.text()} for c in r.crossings],
    }


# --- the sweep it measures ----------------------------------------------------------------------------------

_CONFIG = """\
defaults:
  - override hydra/sweeper: ds_optuna
  - _self_
x: 0.5
"""


def task(cfg) -> float:
    """The trivial task: no training, no call of the package."""
    return float(cfg.x) ** 2


def run_trivial_sweep(workdir: Path, n_trials: int = 3) -> Callable[[], None]:
    """A callable that runs ``python <script> -m x='interval(-1,1)' hydra.sweeper.n_trials=N`` in this process,
    its config and sweep dir under ``workdir``; what the sweep prints is kept and shown only if it fails."""
    conf = workdir / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "trial_path.yaml").write_text(_CONFIG)
    args = ["-m", f"hydra.sweep.dir={workdir / 'sweep'}", f"hydra.sweeper.n_trials={n_trials}",
            "hydra.sweeper.plots=false", "x=interval(-1,1)"]

    def run() -> None:
        from hydra._internal.utils import _run_hydra, get_args_parser
        from hydra.core.singleton import Singleton

        saved = sys.argv[:], os.getcwd(), Singleton.get_state()
        buffer = io.StringIO()
        try:
            sys.argv = [__file__, *args]
            parser = get_args_parser()
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                _run_hydra(args=parser.parse_args(args), args_parser=parser, task_function=task,
                           config_path=str(conf), config_name="trial_path")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise RuntimeError(f"the sweep exited with {e.code}:\n{buffer.getvalue()[-4000:]}") from None
        finally:
            sys.argv, cwd, singletons = saved
            os.chdir(cwd)
            Singleton.set_state(singletons)

    return run


def tree() -> str:
    """The commit of the tree the package was imported from (``+`` when its working tree differs)."""
    import hydra_plugins.ds_optuna_sweeper as pkg

    where = Path(pkg.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+" if dirty else "")


def table(figures: dict) -> str:
    """The markdown tables of :func:`measure`'s figures."""
    rnd, it = figures["round"], figures["iteration"]
    rows = [
        ("stops in the control plane (target <= 10)", "stops"),
        ("... generators resumed not counted", "stops_without_resumed_generators"),
        ("... of which called back through another library", "stops_via_a_library"),
        ("distinct crossings, module -> module", "distinct_module_pairs"),
        ("distinct crossings, function -> function", "distinct_function_pairs"),
        ("climbs back up (target <= 2)", "climbs"),
        ("returns (= stops: every call returns in the round)", "returns"),
        ("control-plane modules visited", "modules_visited"),
        ("control-plane folders visited", "folders_visited"),
        ("glue crossings (_glue, _tracking)", "glue_crossings"),
        ("calls of package functions", "package_calls"),
    ]
    out = [f"One trial (trial {figures['trial']}; the loop asked {figures['asked']}) at n_jobs=1, world size 1:\n",
           "| measure | ask -> tell | whole iteration |", "|---|---:|---:|"]
    out += [f"| {label} | {rnd[key]} | {it[key]} |" for label, key in rows]
    out += ["", "Stops by the loop's step (ask -> tell):\n", "| step | stops |", "|---|---:|"]
    out += [f"| {step} | {n} |" for step, n in sorted(figures["by_step"].items(), key=lambda kv: -kv[1])]
    out += ["", "Stops called back through another library, by library (ask -> tell):\n", "| library | stops |",
            "|---|---:|"]
    out += [f"| {lib} | {n} |" for lib, n in sorted(figures["by_library"].items(), key=lambda kv: -kv[1])]
    out += ["", "The 5 modules with the most crossings (ask -> tell):\n",
            "| module | entered | left | climbs into |", "|---|---:|---:|---:|"]
    out += [f"| {m['module']} | {m['entered']} | {m['left']} | {m['climbs_into']} |" for m in figures["top_modules"]]
    out += ["", "The most frequent crossings (ask -> tell):\n", "| crossing | stops |", "|---|---:|"]
    out += [f"| {p['pair']} | {p['stops']} |" for p in figures["top_pairs"]]
    out += ["", "Climbs back up (ask -> tell):", *(f"  {c}" for c in figures["climbs"])]
    out += ["", "Modules visited (ask -> tell): " + ", ".join(rnd["modules"])]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="also list every crossing of the round, in call order")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--trial", type=int, default=1, help="the round measured (0-based; default 1)")
    parser.add_argument("--trials", type=int, default=3, help="trials of the sweep (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        figures = measure(run_trivial_sweep(Path(tmp), args.trials), trial=args.trial)
    figures["tree"] = tree()
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(f"tree: {figures['tree']}\n")
    print(table(figures))
    if args.list:
        print("\nEvery crossing, in call order ('*': a stop; '^': a climb; '-': before the ask):")
        for c in figures["crossings"]:
            mark = ("^" if c["climb"] else "*" if c["stop"] else " ") + (" " if c["in_round"] else "-")
            print(f"  {mark} [{c['step']}] {c['text']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
