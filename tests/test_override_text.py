"""Case C52: every printed or stored command runs as written for any path a file system allows.

A value in a rerun or resume line passes two parsers: the shell (``shlex``, as bash splits it) and then
Hydra's override grammar (``OverridesParser``, Hydra docs "Override grammar": quoted values, escaping),
and the config then resolves ``${...}`` (OmegaConf). Each awkward value here goes through all three and
must come back unchanged. Before the fix the sweep dir was shell-quoted only: Hydra's lexer refused
``ü`` ("token recognition error"), a ``'``, a space next to ``=``...

Tables for ``_study/_override_text.py`` (issue 39 item 4: rows that kill its mutants).

The rule (module docstring, Hydra docs "Override grammar"): ``format_value`` writes text that Hydra's own parser
reads back to exactly the value, type included, plain when plain text reads back the same, else single-quoted,
else escaped; ``literal_value`` also escapes OmegaConf's ``${``; refusals quote at most 200 characters (C58).
Each row checks the text and, independently of ``format_value``'s own check, that Hydra parses it back.
"""

from __future__ import annotations

import shlex
import sys

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hydra_plugins.ds_optuna_sweeper._study._command import rerun_line, resume_command
from hydra_plugins.ds_optuna_sweeper._errors import SearchSpaceError
from hydra_plugins.ds_optuna_sweeper._study._override_text import (
    SHOWN_CHARS,
    command_line_overrides,
    format_value,
    literal_value,
    override_line,
    parse_overrides,
    read_override_value,
    shorten,
)

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


@pytest.mark.parametrize("value, text", [
    (None, "null"),
    (True, "true"),
    (False, "false"),
    (0, "0"),
    (-3, "-3"),
    (1.0, "1.0"),                        # a float stays a float
    (1e-5, "1e-05"),                     # repr: shortest text that round-trips float64
    (0.1 + 0.2, "0.30000000000000004"),
    ([1, "a", None], "[1,a,null]"),
    ((True,), "[true]"),
    ([], "[]"),
    ({"a": 1, "b": [2.5]}, "{a:1,b:[2.5]}"),
    ({2: "x", True: None}, "{2:x,true:null}"),  # Hydra reads a key as a value: {2:x} has the int key 2
    ({"a b": 1}, "{a b:1}"),
    ({}, "{}"),
    ("abc", "abc"),                      # plain when Hydra reads plain text back the same
    ("a b", "a b"),
    ("", ""),
    ("1", "'1'"),                        # would read back as an int: quoted
    ("1.5", "'1.5'"),
    ("true", "'true'"),
    ("null", "'null'"),
    ("a,b", "'a,b'"),
    ("x=y", "'x=y'"),
    (" a", "' a'"),                      # leading space would be stripped
    ("it's", "'it\\'s'"),
    ('a"b"\'c', "'a\"b\"\\'c'"),
])
def test_format_value_writes_what_hydra_reads_back(value, text):
    assert format_value(value) == text
    parsed = PARSER.parse_override(f"k={text}").value()
    if isinstance(value, tuple):
        value = list(value)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("value, message", [
    (b"x", "Cannot write a bytes as a Hydra override value: b'x'"),
    (1j, "Cannot write a complex as a Hydra override value: 1j"),
    ({1, 2}, "Cannot write a set as a Hydra override value: {1, 2}"),
])
def test_format_value_refuses_other_types(value, message):
    with pytest.raises(TypeError) as err:
        format_value(value)
    assert str(err.value) == message


@pytest.mark.parametrize("value, message", [
    ({"1": "x"}, "Cannot write the dict {'1': 'x'} as a Hydra override value"),  # Hydra has no quoted key
    ({"a,b": 1}, "Cannot write the dict {'a,b': 1} as a Hydra override value"),
])
def test_format_value_refuses_a_dict_hydra_cannot_read_back(value, message):
    with pytest.raises(SearchSpaceError) as err:
        format_value(value)
    assert str(err.value) == message


@pytest.mark.parametrize("key, value, line", [
    ("lr", 1e-4, "lr=0.0001"),
    ("model.name", "a,b", "model.name='a,b'"),
    ("flag", None, "flag=null"),
])
def test_override_line(key, value, line):
    assert override_line(key, value) == line


@pytest.mark.parametrize("path, text", [
    ("/tmp/a b", "/tmp/a b"),
    ("${x}", "\\${x}"),                  # OmegaConf would resolve ${x}: escaped
    ("a/${x}/${y}", "a/\\${x}/\\${y}"),
    ("\\${x}", "'\\\\\\${x}'"),          # a backslash before it is doubled, then Hydra-quoted
    ("p\\q", "p\\q"),                    # a backslash elsewhere is left alone
    ("$x {y}", "'$x {y}'"),               # braces need quotes in Hydra's grammar
    ("it's", "'it\\'s'"),
])
def test_literal_value_sets_exactly_the_text(path, text):
    assert literal_value(path) == text
    parsed = PARSER.parse_override(f"k={text}").value()
    assert OmegaConf.create({"k": parsed}).k == path  # what the task's config resolves it to


@pytest.mark.parametrize("text, limit, short", [
    ("x" * SHOWN_CHARS, SHOWN_CHARS, "x" * SHOWN_CHARS),
    ("x" * (SHOWN_CHARS + 5), SHOWN_CHARS, "x" * SHOWN_CHARS + "... (5 more characters)"),
    ("abc", 2, "ab... (1 more characters)"),
    ("abc", 3, "abc"),
])
def test_shorten(text, limit, short):
    assert shorten(text, limit) == short


def test_shown_chars_is_200():  # case C58: a 6.6 kB one-line message
    assert SHOWN_CHARS == 200
    assert shorten("y" * 201) == "y" * 200 + "... (1 more characters)"


def test_parse_overrides_reads_each_line_with_hydras_parser():
    parsed = parse_overrides(["a=1", "b=choice(x,y)", "+c=null"])
    assert [(o.key_or_group, o.value() if i != 1 else o.value().list) for i, o in enumerate(parsed)] == [
        ("a", 1), ("b", ["x", "y"]), ("c", None)]


@pytest.mark.parametrize("lines, where, message", [
    (["a=1", "x=["], ["p.a", "the command line"],
     "Cannot parse the sweep override 'x=[' (the command line): no viable alternative at input '['"),
    (["x=["], None, "Cannot parse the sweep override 'x=[': no viable alternative at input '['"),
    (["x=choice(a,null)"], ["hydra.sweeper.params.x"],
     "Cannot parse the sweep override 'x=choice(a,null)' (hydra.sweeper.params.x): TypeError while evaluating "
     "'choice(a,null)': mismatch type argument args[1]: NoneType is incompatible with Union[str, int, float, bool, "
     "Dict[Any, Any], List[Any], ChoiceSweep]. Hydra's choice(...) does not take null; write 'x=a,null' (Hydra's "
     "simple choice form, which keeps null)"),
])
def test_parse_overrides_names_the_line_and_where(lines, where, message):
    with pytest.raises(SearchSpaceError) as err:
        parse_overrides(lines, where)
    assert str(err.value) == message


def test_parse_overrides_quotes_at_most_200_characters_of_the_line():
    line = "x=[" + "1," * 150
    with pytest.raises(SearchSpaceError) as err:
        parse_overrides([line])
    assert str(err.value).startswith(f"Cannot parse the sweep override '{line[:200]}... ({len(line) - 200} more "
                                     "characters)': ")


@pytest.mark.parametrize("text, value", [
    ("1", 1), ("1.5", 1.5), ("true", True), ("null", None), ("'1'", "1"), ("[1,a]", [1, "a"]),
    ("{a:1}", {"a": 1}), ("a b", "a b"),
])
def test_read_override_value(text, value):
    got = read_override_value(text)
    assert got == value and type(got) is type(value)


def test_read_override_value_refuses_bad_syntax():
    with pytest.raises(SearchSpaceError) as err:
        read_override_value("[")
    assert str(err.value) == "Cannot parse the override value '[': no viable alternative at input '['"


def test_command_line_overrides_keep_interpolations():
    cfg = OmegaConf.create({"hydra": {"overrides": {
        "hydra": ["hydra.sweep.subdir=${hydra.job.num}_x", "hydra/sweeper=ds_optuna"],
        "task": ["lr=0.1"]}}})
    assert command_line_overrides(cfg) == ["hydra.sweep.subdir=${hydra.job.num}_x", "hydra/sweeper=ds_optuna"]
    assert command_line_overrides(cfg, "task") == ["lr=0.1"]
    assert command_line_overrides(cfg, "other") == []
    assert command_line_overrides(None) == []


@pytest.mark.parametrize("error, reason", [
    (RuntimeError(), "RuntimeError"),                   # no text: the error's type
    (ValueError("  "), "ValueError"),
    (ValueError("line one\nthe reason\n"), "the reason"),  # Hydra's last line says why
])
def test_parse_overrides_reason_is_the_errors_last_line_or_its_type(monkeypatch, error, reason):
    from hydra_plugins.ds_optuna_sweeper._study import _override_text

    class Parser:
        def parse_override(self, line):
            raise error

    monkeypatch.setattr(_override_text, "_parser", lambda: Parser())
    with pytest.raises(SearchSpaceError) as err:
        parse_overrides(["x=1"])
    assert str(err.value) == f"Cannot parse the sweep override 'x=1': {reason}"
