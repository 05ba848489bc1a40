"""Case C59: search expressions a new user gets wrong are refused with the reason and the fix.

- ``'lr=range(0.001,0.3)'``: Hydra's range with the default step 1 yields one value, and the whole sweep
  ran at 0.001 without a word. A range that yields one value is refused (say why, suggest interval or a
  step); the same kind: a step larger than the span, ``range(1)``, reversed with a big negative step.
- ``lr=interval(1e-3, 3e-1)`` typed unquoted: the shell splits it and Hydra's parser says only "no viable
  alternative"; a hint names the split arguments and the quoted override.
"""

from __future__ import annotations

import sys
import time

import pytest

from hydra_plugins.ds_optuna_sweeper import _argv_hint
from hydra_plugins.ds_optuna_sweeper._argv_hint import split_hint, split_overrides
from hydra_plugins.ds_optuna_sweeper._errors import SearchSpaceError
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space
from tests.in_process import run_app


@pytest.mark.parametrize("line, fragments", [
    ("lr=range(0.001,0.3)", ["yields one value (0.001)", "steps of 1 (the default)", "interval(0.001, 0.3)",
                             "tag(log, interval(0.001, 0.3))", "step=0.01", "lr=0.001"]),
    ("x=range(0,0.3,step=0.5)", ["yields one value (0.0)", "steps of 0.5 and", "interval(0, 0.3);", "step=0.01"]),
    ("x=range(1)", ["yields one value (0)", "interval(0, 1)", "x=0."]),
    ("x=range(1,2)", ["yields one value (1)", "x=1."]),
    ("x=range(3,2,-5)", ["yields one value (3)", "interval(2, 3)", "step=-0.1"]),
    ("+x=range(5,6)", ["yields one value (5)", "+x=5."]),
    # the same family, refused before this change too
    ("x=range(5,1)", ["is empty"]),
    ("x=range(0.1,0.1)", ["is empty"]),
    ("x=range(1,5,step=0)", ["step 0"]),
    ("x=tag(log,interval(0,1))", ["bound <= 0"]),
    ("x=tag(log,range(0,5))", ["bound <= 0"]),
    ("x=interval(0.3,0.001)", ["reversed or empty"]),
])
def test_c59_a_range_of_one_value_and_its_kind_are_refused_with_the_fix(line, fragments):
    with pytest.raises(SearchSpaceError) as e:
        build_search_space({}, [line])
    for fragment in fragments:
        assert fragment in str(e.value), str(e.value)


@pytest.mark.parametrize("line, n", [("x=range(0.001,0.3,0.01)", 30), ("x=range(1,3)", 2), ("x=range(0,1,0.5)", 2)])
def test_c59_ranges_of_two_or_more_values_still_sweep(line, n):
    assert len(build_search_space({}, [line]).params["x"].values) == n


@pytest.mark.parametrize("argv, runs", [
    (["-m", "lr=interval(1e-3,", "3e-1)"], [(["lr=interval(1e-3,", "3e-1)"], "lr=interval(1e-3, 3e-1)")]),
    (["x=choice(1,", "2,", "3)", "y=1"], [(["x=choice(1,", "2,", "3)"], "x=choice(1, 2, 3)")]),
    (["lr=tag(log,", "interval(1e-5,", "1e-3))"], [(["lr=tag(log,", "interval(1e-5,", "1e-3))"],
                                                   "lr=tag(log, interval(1e-5, 1e-3))")]),
    (["+y=[1,", "2]"], [(["+y=[1,", "2]"], "+y=[1, 2]")]),
    (["x=interval(1e-3, 3e-1)", "y=choice(a,b)", "z='(unbalanced in quotes'"], []),  # quoted: nothing to say
    (["x=interval(1e-3,"], []),  # never balanced: not a split, Hydra's own error stands
    (["--config-name", "a(b", "c)"], []),
])
def test_c59_split_sweep_arguments_are_found(argv, runs):
    assert split_overrides(argv) == runs
    assert (split_hint(argv) is None) == (not runs)


def test_c59_the_hint_is_printed_before_hydras_parse_error(tmp_path, monkeypatch):
    """The real command line, in process (``tests/in_process.py``): the hint is printed by the sweeper's search-path
    plugin, which Hydra calls before it parses the overrides (``config.py``); once per process, so reset here."""
    monkeypatch.setattr(_argv_hint, "_shown", False)
    res = run_app("sweep_app", ["-m", f"hydra.sweep.dir={tmp_path}", "lr=interval(1e-3,", "3e-1)"], config_name="app")
    assert res.returncode == 1
    hint = "got 2 arguments 'lr=interval(1e-3,' '3e-1)'; write 'lr=interval(1e-3, 3e-1)'"
    assert hint in res.output and res.output.index(hint) < res.output.index("no viable alternative"), res.output


def test_c59_another_rank_waits_for_rank_0_to_print_the_hint_and_prints_nothing(monkeypatch, capsys):
    """A newcomer's 2-rank run showed the hint once in 4: rank 1 reached Hydra's error first, torchrun stopped rank 0
    before it printed. Every other rank now waits PEER_DELAY_S before Hydra refuses; with clean arguments no rank
    waits. Positive control: rank 0 prints at once."""
    monkeypatch.setattr(_argv_hint, "PEER_DELAY_S", 0.5)
    for rank, argv, waits, prints in (("1", ["lr=interval(1e-3,", "3e-1)"], True, False),
                                      ("1", ["lr=interval(1e-3,3e-1)"], False, False),
                                      ("0", ["lr=interval(1e-3,", "3e-1)"], False, True)):
        monkeypatch.setattr(_argv_hint, "_shown", False)
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setattr(sys, "argv", ["app.py", "-m", *argv])
        start = time.monotonic()
        _argv_hint.print_argv_hint()
        assert (time.monotonic() - start >= 0.5) is waits, (rank, argv)
        assert ("got 2 arguments" in capsys.readouterr().err) is prints, (rank, argv)
