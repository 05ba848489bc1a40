"""Case C58 (two parts): ``null`` inside ``choice(...)``, and the length of a refusal about one bad value.

Hydra's grammar refuses ``choice(a,null)``: its ``choice`` function is typed (str, int, float, bool, dict,
list; ``hydra/_internal/grammar/grammar_functions.py``), so "NoneType is incompatible". The simple form
``a,null`` builds the sweep without that function and keeps ``None``. The sweeper cannot change Hydra's
grammar: it names the fix (on the command line before Hydra's own error, in ``params`` in its refusal),
and the README says null goes in the simple form. A ``params`` node of 200 keys with one bad value
printed every key in a 6.6 kB one-line message; the refusal now names the offending key and value only.
"""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution

from hydra_plugins.ds_optuna_sweeper import _argv_hint
from hydra_plugins.ds_optuna_sweeper._argv_hint import argv_hint, null_choice_hint
from hydra_plugins.ds_optuna_sweeper._errors import SearchSpaceError
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space
from tests.in_process import run_app


def test_c58_the_simple_form_sweeps_null():
    spec = build_search_space({"c": "a,null"}, ["+d=1,null"]).params
    assert spec["c"].distribution == CategoricalDistribution(["a", None])
    assert spec["d"].distribution == CategoricalDistribution([1, None])


def test_c58_a_200_key_params_node_with_one_null_choice_names_that_key_only():
    params = {f"k{i}": "choice(1,2,3)" for i in range(200)}
    params["k77"] = "choice(a,null)"
    with pytest.raises(SearchSpaceError) as e:
        build_search_space(params, [])
    text = str(e.value)
    assert "'k77=choice(a,null)' (hydra.sweeper.params.k77)" in text and "write 'k77=a,null'" in text, text
    assert "k76" not in text and "k78" not in text and len(text) < 600, text


def test_c58_a_long_bad_value_is_cut():
    with pytest.raises(SearchSpaceError) as e:
        build_search_space({"x": "interval(" + "1," * 2000}, [])
    assert "(hydra.sweeper.params.x)" in str(e.value) and "more characters" in str(e.value)
    assert len(str(e.value)) < 800, len(str(e.value))


@pytest.mark.parametrize("line, fix", [
    ("c=choice(a,null)", "write 'c=a,null'"),
    ("+c=choice(null, 1, 2)", "write '+c=null, 1, 2'"),
    ("c=tag(log,choice(a,null))", "simple form"),
    ("c=choice(a,'null')", None),     # a quoted 'null' is the string, which Hydra accepts
    ('c=choice("x,null",b)', None),
    ("c=choice(a,nullable)", None),
    ("c=null", None),
    ("c=a,null", None),
])
def test_c58_null_inside_choice_gets_the_simple_form(line, fix):
    hint = null_choice_hint(line)
    assert (hint is None) if fix is None else (fix in hint), hint


def test_c58_a_params_node_given_on_the_command_line_gets_no_argv_hint():
    assert argv_hint(["hydra.sweeper.params={k:'choice(a,null)'}"]) is None


def test_c58_on_the_command_line_the_fix_is_printed_before_hydras_error(tmp_path, monkeypatch):
    """The real command line, in process (``tests/in_process.py``): the hint is printed by the sweeper's search-path
    plugin, which Hydra calls before it parses the overrides (``config.py``); once per process, so reset here."""
    monkeypatch.setattr(_argv_hint, "_shown", False)
    res = run_app("sweep_app", ["-m", f"hydra.sweep.dir={tmp_path}", "+c=choice(a,null)"], config_name="app")
    assert res.returncode == 1
    hint = "'+c=choice(a,null)': Hydra's choice(...) does not take null; write '+c=a,null'"
    assert hint in res.output and res.output.index(hint) < res.output.index("NoneType is incompatible"), res.output
