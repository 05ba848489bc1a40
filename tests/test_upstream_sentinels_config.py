"""Sentinels for the Hydra, OmegaConf and Optuna private APIs the config side uses through ``_upstream``.

One test per adapter function: each calls it on the installed upstream and checks the behaviour the
sweeper relies on, so an upstream release that moves or changes the private API fails here, naming it,
rather than inside a sweep.
"""

import math

import pytest
from omegaconf import OmegaConf

from hydra_plugins.ds_optuna_sweeper import _upstream
from hydra_plugins.ds_optuna_sweeper._study._override_text import read_override_value


def test_escape_override_text_escapes_what_hydras_grammar_reads_back():
    """``hydra._internal.grammar.utils.escape_special_characters``: a string with grammar characters,
    escaped, parses back to itself."""
    text = "a=b, (c) [d] {e} \\f"
    escaped = _upstream.escape_override_text(text)
    assert escaped != text, "escape_special_characters no longer escapes Hydra's grammar characters"
    assert read_override_value(escaped) == text


def test_plain_override_value_unquotes_choice_elements():
    """``Override._convert_value``: a choice's QuotedString becomes a str, numbers and bools stay as they
    are, and containers are converted element by element."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweep = OverridesParser.create().parse_override("k=choice('a b',1,2.5,true)").value()
    assert [_upstream.plain_override_value(v) for v in sweep.list] == ["a b", 1, 2.5, True]
    listed = OverridesParser.create().parse_override("k=['x',[1]]").value()
    assert _upstream.plain_override_value(listed) == ["x", [1]]


def test_config_child_node_returns_the_node_without_resolving():
    """OmegaConf ``BaseContainer._get_node``: the child node, its interpolation left unresolved (a
    missing interpolation target does not raise)."""
    from omegaconf import DictConfig

    cfg = OmegaConf.create({"a": {"b": 1}, "c": "${missing}"})
    child = _upstream.config_child_node(cfg, "a")
    assert isinstance(child, DictConfig) and list(child.keys()) == ["b"]
    leaf = _upstream.config_child_node(cfg, "c")
    assert leaf._value() == "${missing}", "_get_node now resolves interpolations"
    assert _upstream.config_child_node(cfg, "nope") is None


def test_distribution_contains_checks_bounds_steps_and_choices():
    """Optuna ``BaseDistribution._contains`` with ``to_internal_repr``: bounds, steps and choices."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    assert _upstream.distribution_contains(FloatDistribution(0.0, 1.0), 0.5)
    assert not _upstream.distribution_contains(FloatDistribution(0.0, 1.0), 1.5)
    assert _upstream.distribution_contains(IntDistribution(0, 10, step=2), 4)
    assert not _upstream.distribution_contains(IntDistribution(0, 10, step=2), 3)
    assert _upstream.distribution_contains(CategoricalDistribution(["a", 1]), 1)
    with pytest.raises(ValueError):
        _upstream.distribution_contains(CategoricalDistribution(["a", 1]), "b")
    try:
        inside = _upstream.distribution_contains(FloatDistribution(0.0, 1.0), math.nan)
    except ValueError:
        inside = False
    assert not inside
