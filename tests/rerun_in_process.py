"""``tests/apps/rerun_app.py`` in process, and the lines a sweep prints to rerun, refit or resume, run as a
user pastes them but inside pytest (issue 39 item 1: a pasted ``torchrun`` line costs a launch).

:func:`run_rerun_app` is :func:`tests.in_process.run_app` with the app's own config dir (``conf_rerun``).
:func:`paste_in_process` splits a pasted line as bash does (``shlex``: the lines are POSIX-quoted), checks its
shape (``VAR=value ...`` assignments, then ``python -m torch.distributed.run`` or ``torchrun`` with
``--standalone --nproc_per_node 1``, or plain ``python``, then the script and its arguments) and runs the
script's arguments in process with those variables set. What bash and torchrun themselves do with the line at
more than one rank (one run dir for every rank) is the real launch's in ``tests/multirank/test_refit.py``.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from tests.in_process import APPS, InProcessResult, run_app

_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def run_rerun_app(args: list[str], *, config_name: str = "rerun", env: dict[str, str] | None = None,
                  cwd: Path | None = None) -> InProcessResult:
    """``python tests/apps/rerun_app.py *args`` in process (its configs are under ``tests/apps/conf_rerun``)."""
    return run_app("rerun_app", args, config_name=config_name, config_dir="conf_rerun", env=env, cwd=cwd)


def split_pasted_line(line: str) -> tuple[dict[str, str], list[str], str, list[str]]:
    """``(variables, launcher words, script path, script arguments)`` of a one-line command, split as bash
    splits it; a line bash would not run as one simple command (a newline, ``;``, ``&&``, a pipe) fails."""
    assert "\n" not in line, line
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    words = list(lexer)
    assert not any(w and set(w) <= set(";&|<>") for w in words), f"not one simple command: {line}"
    env: dict[str, str] = {}
    while words and _ASSIGN.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    script_at = next(i for i, w in enumerate(words) if w.endswith(".py"))
    return env, words[:script_at], words[script_at], words[script_at + 1:]


def run_pasted_line(line: str, *, cwd: Path, env: dict[str, str] | None = None) -> InProcessResult:
    """Run a pasted one-line command of a test app in process, in ``cwd``, with the line's own variables and
    ``env``: ``rerun_app.py`` with its configs, any other app with ``conf/app.yaml``. A ``torchrun`` line must
    be the world size 1 one (``--standalone --nproc_per_node 1``)."""
    variables, launcher, script, args = split_pasted_line(line)
    assert Path(launcher[0]).name.startswith("python") or launcher[0] == "torchrun", launcher
    rest = launcher[1:]
    if rest[:2] == ["-m", "torch.distributed.run"]:
        rest = rest[2:]
    if rest or launcher[0] == "torchrun":
        assert rest == ["--standalone", "--nproc_per_node", "1"], launcher
    path = Path(script) if Path(script).is_absolute() else cwd / script
    assert path.is_file() and path.parent == APPS, script
    run_env = {**variables, **(env or {})}
    if path.stem == "rerun_app":
        return run_rerun_app(args, env=run_env, cwd=cwd)
    return run_app(path.stem, args, config_name="app", env=run_env, cwd=cwd)


def paste_in_process(tmp_path: Path, line: str, *, stage: str = "search", cwd: Path | None = None) -> float:
    """Run a ``rerun_app.py`` rerun or refit line (world size 1) in process, as pasted in ``cwd`` (default
    ``tmp_path``), and return the value the app recorded for ``stage`` (``paste_rerun_line``'s twin; the app
    records under ``tmp_path/rec_pasted``)."""
    rec = tmp_path / "rec_pasted"
    run_pasted_line(line, cwd=cwd or tmp_path, env={"DSO_RECORD_DIR": str(rec)}).check()
    return json.loads((rec / f"value_single_{stage}_run.json").read_text())["value"]
