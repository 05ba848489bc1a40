"""Case C52: every printed or stored command runs as written for any path a file system allows.

A value in a rerun or resume line passes two parsers: the shell (``shlex``, as bash splits it) and then
Hydra's override grammar (``OverridesParser``, Hydra docs "Override grammar": quoted values, escaping),
and the config then resolves ``${...}`` (OmegaConf). Each awkward value here goes through all three and
must come back unchanged. Before the fix the sweep dir was shell-quoted only: Hydra's lexer refused
``ü`` ("token recognition error"), a ``'``, a space next to ``=``...
"""

from __future__ import annotations

import shlex
import sys

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hydra_plugins.ds_optuna_sweeper._study._command import rerun_line, resume_command

AWKWARD = [
    "/tmp/H4 dir/ünïcødé 東京 b", "/tmp/it's", '/tmp/say "hi"', "/tmp/back\\slash", "/tmp/trailing\\",
    "/tmp/$HOME", "/tmp/a=b", "/tmp/a,b", "/tmp/[a]", "/tmp/{a}", "/tmp/a}b", "/tmp/${x}", "/tmp/${oc.env:HOME}",
    "/tmp/a'\\", "/tmp/tab\tx", " /tmp/leading space", "/tmp/trailing space ", "/tmp/a:b", "/tmp/(a)",
    "/tmp/a#b", "/tmp/a;b&c|d", "/tmp/*?~", "/tmp/%d", "/tmp/\\'", "/tmp/a\\${x}",
]

PARSER = OverridesParser.create()


def _value_through_shell_hydra_and_omegaconf(line: str, key: str) -> str:
    words = shlex.split(line)
    [word] = [w for w in words if w.startswith(f"{key}=")]
    override = PARSER.parse_override(word)
    return OmegaConf.create({"v": override.value()}).v


@pytest.mark.parametrize("path", AWKWARD)
def test_c52_resume_line_gives_hydra_the_sweep_dir_unchanged(path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["app.py", "-m", "hydra.sweep.dir=/old", "x=interval(0,1)"])
    line = resume_command(path)
    assert _value_through_shell_hydra_and_omegaconf(line, "hydra.sweep.dir") == path, line
    assert "hydra.sweep.dir=/old" not in line and "x=interval(0,1)" in shlex.split(line)


@pytest.mark.parametrize("path", AWKWARD)
def test_c52_rerun_line_gives_hydra_the_run_dir_unchanged(path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["app.py", "-m", "x=interval(0,1)"])
    line = rerun_line(["x=0.5"], run_dir=path)
    assert _value_through_shell_hydra_and_omegaconf(line, "hydra.run.dir") == path, line
