"""Tables for ``_study/_distributions.py`` (issue 39 item 4: rows that kill its mutants).

The rules (module docstring; Hydra's override grammar; the official Optuna sweeper's documentation): ``choice``
is categorical, ``range`` yields Hydra's values with stop excluded (case C11), ``interval`` is a linear float
(``int(...)``: int), ``tag(log, ...)`` log-scaled (case C12); every refusal names the override as typed and says
that nothing was asked from the study.
"""

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hydra_plugins.ds_optuna_sweeper._errors import SearchSpaceError
from hydra_plugins.ds_optuna_sweeper._study._distributions import (
    ParamSpec,
    _example_step,
    create_param,
    describe_distribution,
    expression_text,
)
from hydra_plugins.ds_optuna_sweeper._study._override_text import parse_overrides

TAIL = " Nothing was asked from the study and no rank started training."


def _param(line):
    return create_param(parse_overrides([line])[0])


@pytest.mark.parametrize("line, spec", [
    ("x=choice(a,1,2.5,true)",
     ParamSpec("x", "x", CategoricalDistribution(["a", 1, 2.5, True]), "choice(a,1,2.5,true)", ("a", 1, 2.5, True))),
    ("x=a,null", ParamSpec("x", "x", CategoricalDistribution(["a", None]), "a,null", ("a", None))),
    ("+x=choice(1)", ParamSpec("x", "+x", CategoricalDistribution([1]), "choice(1)", (1,))),
    ("++y=1,2", ParamSpec("y", "++y", CategoricalDistribution([1, 2]), "1,2", (1, 2))),
    ("x=choice('1',b)", ParamSpec("x", "x", CategoricalDistribution(["1", "b"]), "choice('1',b)", ("1", "b"))),
    # range: stop excluded (C11)
    ("x=range(1,5)", ParamSpec("x", "x", IntDistribution(1, 4), "range(1,5)", (1, 2, 3, 4))),
    ("x=range(1,10,step=3)", ParamSpec("x", "x", IntDistribution(1, 7, step=3), "range(1,10,step=3)", (1, 4, 7))),
    ("x=range(5,1,step=-2)", ParamSpec("x", "x", IntDistribution(3, 5, step=2), "range(5,1,step=-2)", (5, 3))),
    ("x=range(0.1,0.5,step=0.1)",
     ParamSpec("x", "x", FloatDistribution(0.1, 0.4, step=0.1), "range(0.1,0.5,step=0.1)",
               (0.1, 0.2, 0.30000000000000004, 0.4))),
    ("x=range(1.0,4.0)", ParamSpec("x", "x", FloatDistribution(1.0, 3.0, step=1.0), "range(1.0,4.0)", (1.0, 2.0, 3.0))),
    ("x=range(0,3,step=1.5)", ParamSpec("x", "x", FloatDistribution(0.0, 1.5, step=1.5), "range(0,3,step=1.5)",
                                        (0.0, 1.5))),
    ("x=range(3,0,step=-1.5)", ParamSpec("x", "x", FloatDistribution(1.5, 3.0, step=1.5), "range(3,0,step=-1.5)",
                                         (3.0, 1.5))),
    ("x=tag(log,range(1,8))",
     ParamSpec("x", "x", IntDistribution(1, 7, log=True), "tag(log,range(1,8))", (1, 2, 3, 4, 5, 6, 7))),
    ("x=tag(log,range(4,1,step=-1))",
     ParamSpec("x", "x", IntDistribution(2, 4, log=True), "tag(log,range(4,1,step=-1))", (4, 3, 2))),
    # interval: float unless int(...), log under tag(log, ...) (C12)
    ("x=interval(0,1)", ParamSpec("x", "x", FloatDistribution(0.0, 1.0), "interval(0,1)")),
    ("x=int(interval(1,9))", ParamSpec("x", "x", IntDistribution(1, 9), "int(interval(1,9))")),
    ("x=tag(log,interval(1e-5,1e-3))",
     ParamSpec("x", "x", FloatDistribution(1e-5, 1e-3, log=True), "tag(log,interval(1e-5,1e-3))")),
    ("x=tag(log,int(interval(1,64)))",
     ParamSpec("x", "x", IntDistribution(1, 64, log=True), "tag(log,int(interval(1,64)))")),
    ("x=interval(-2.5,-1)", ParamSpec("x", "x", FloatDistribution(-2.5, -1.0), "interval(-2.5,-1)")),
])
def test_create_param(line, spec):
    got = _param(line)
    assert got == spec
    if got.values is not None:
        assert [type(v) for v in got.values] == [type(v) for v in spec.values]


@pytest.mark.parametrize("line, message", [
    ("x=choice([1,2],3)", "Search space: 'x=choice([1,2],3)' has a choice of type list ([1, 2]). Optuna stores "
                          "categorical choices as str, int, float, bool or null; sweep a config group or several "
                          "keys instead."),
    ("x=choice({a:1})", "Search space: 'x=choice({a:1})' has a choice of type dict ({'a': 1}). Optuna stores "
                        "categorical choices as str, int, float, bool or null; sweep a config group or several "
                        "keys instead."),
    ("x=tag(log,choice(1,2))", "Search space: 'x=tag(log,choice(1,2))' puts tag(log) on a choice. Log scale "
                               "applies to interval and range only."),
    ("x=range(1,5,step=0)", "Search space: 'x=range(1,5,step=0)' has step 0. Give a non-zero step."),
    ("x=range(5,1)", "Search space: 'x=range(5,1)' is empty: range(5, 1, step=1) yields no value (stop is "
                     "excluded, as in Python and Hydra). Check the order of start and stop and the sign of step."),
    # C59: one value
    ("x=range(0.001,0.3)",
     "Search space: 'x=range(0.001,0.3)' yields one value (0.001): range(start, stop, step) counts from start in "
     "steps of 1 (the default) and excludes stop. For a float search write interval(0.001, 0.3) (or tag(log, "
     "interval(0.001, 0.3))); for steps give a smaller step, e.g. range(0.001, 0.3, step=0.01); for a fixed value "
     "write x=0.001."),
    ("x=range(-0.3,-0.001)",
     "Search space: 'x=range(-0.3,-0.001)' yields one value (-0.3): range(start, stop, step) counts from start in "
     "steps of 1 (the default) and excludes stop. For a float search write interval(-0.3, -0.001); for steps give "
     "a smaller step, e.g. range(-0.3, -0.001, step=0.01); for a fixed value write x=-0.3."),
    ("x=range(0,0.5)",
     "Search space: 'x=range(0,0.5)' yields one value (0.0): range(start, stop, step) counts from start in steps "
     "of 1 (the default) and excludes stop. For a float search write interval(0, 0.5); for steps give a smaller "
     "step, e.g. range(0, 0.5, step=0.01); for a fixed value write x=0.0."),
    ("x=range(1,2,step=1)",
     "Search space: 'x=range(1,2,step=1)' yields one value (1): range(start, stop, step) counts from start in "
     "steps of 1 and excludes stop. For a float search write interval(1, 2) (or tag(log, interval(1, 2))); for "
     "steps give a smaller step, e.g. range(1, 2, step=0.1); for a fixed value write x=1."),
    ("+x=range(3,1,step=-5)",
     "Search space: '+x=range(3,1,step=-5)' yields one value (3): range(start, stop, step) counts from start in "
     "steps of -5 and excludes stop. For a float search write interval(1, 3) (or tag(log, interval(1, 3))); for "
     "steps give a smaller step, e.g. range(3, 1, step=-0.1); for a fixed value write +x=3."),
    ("x=tag(log,range(0,5))", "Search space: 'x=tag(log,range(0,5))' is log-scaled with a bound <= 0 (low 0). "
                              "Use bounds above 0."),
    ("x=tag(log,range(-3,2))", "Search space: 'x=tag(log,range(-3,2))' is log-scaled with a bound <= 0 (low -3). "
                               "Use bounds above 0."),
    ("x=tag(log,range(1,9,step=2))", "Search space: 'x=tag(log,range(1,9,step=2))' is log-scaled with a step "
                                     "other than 1. Optuna's log scale needs step 1."),
    ("x=tag(log,range(0.5,3.5))", "Search space: 'x=tag(log,range(0.5,3.5))' is a log-scaled float range. Use "
                                  "tag(log, interval(...)) instead."),
    ("x=interval(1,1)", "Search space: 'x=interval(1,1)' is reversed or empty (low 1.0, high 1.0). Write "
                        "interval(low, high) with low < high."),
    ("x=interval(2,1)", "Search space: 'x=interval(2,1)' is reversed or empty (low 2.0, high 1.0). Write "
                        "interval(low, high) with low < high."),
    ("x=interval(-1.0,nan)", "Search space: 'x=interval(-1.0,nan)' is reversed or empty (low -1.0, high nan). "
                             "Write interval(low, high) with low < high."),
    ("x=interval(0,inf)", "Search space: 'x=interval(0,inf)' has an infinite or NaN bound. Use finite bounds."),
    ("x=interval(-inf,0)", "Search space: 'x=interval(-inf,0)' has an infinite or NaN bound. Use finite bounds."),
    ("x=tag(log,interval(0,1))", "Search space: 'x=tag(log,interval(0,1))' is log-scaled with a bound <= 0 (low "
                                 "0.0). Use bounds above 0."),
    ("x=tag(log,int(interval(-1,4)))", "Search space: 'x=tag(log,int(interval(-1,4)))' is log-scaled with a bound "
                                       "<= 0 (low -1). Use bounds above 0."),
    ("x=glob(*)", "Search space: 'x=glob(*)' is a glob_choice_sweep sweep, which this sweeper cannot sample. Use "
                  "choice(...), range(...) or interval(...); glob(...) is not supported."),
])
def test_create_param_refuses(line, message):
    with pytest.raises(SearchSpaceError) as err:
        _param(line)
    assert str(err.value) == message + TAIL


def test_a_log_interval_from_a_small_positive_bound_is_taken():
    assert _param("x=tag(log,interval(1e-300,1))").distribution == FloatDistribution(1e-300, 1.0, log=True)
    assert _param("x=tag(log,range(1,3))").distribution == IntDistribution(1, 2, log=True)


@pytest.mark.parametrize("values, sampled, value", [
    (None, 0.123, 0.123),                               # interval: as drawn
    ((0.1, 0.2, 0.30000000000000004, 0.4), 0.30000000000000004, 0.30000000000000004),
    ((0.1, 0.2, 0.30000000000000004, 0.4), 0.3, 0.30000000000000004),  # snapped to Hydra's number
    ((0.0, 1.5), 1.4, 1.5),
    ((0.0, 1.5), 0.7, 0.0),
    ((1, 2, 3), 2, 2),                                  # not a float: as drawn
    (("a", "b"), "b", "b"),
    ((), 0.5, 0.5),
])
def test_to_override_value(values, sampled, value):
    got = ParamSpec("x", "x", None, "e", values).to_override_value(sampled)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("dist, text", [
    (CategoricalDistribution(["a", 1, None]), "one of ['a', 1, None]"),
    (FloatDistribution(0.0, 1.0), "float in [0.0, 1.0]"),
    (FloatDistribution(1e-5, 1e-3, log=True), "float in [1e-05, 0.001], log"),
    (FloatDistribution(0.1, 0.4, step=0.1), "float in [0.1, 0.4] step 0.1"),
    (FloatDistribution(1.0, 3.0, step=1.0), "float in [1.0, 3.0] step 1.0"),  # a float step of 1 is shown
    (IntDistribution(1, 4), "int in [1, 4]"),
    (IntDistribution(1, 7, step=3), "int in [1, 7] step 3"),
    (IntDistribution(1, 64, log=True), "int in [1, 64], log"),
    ("other", "'other'"),
])
def test_describe_distribution(dist, text):
    assert describe_distribution(dist) == text


@pytest.mark.parametrize("start, stop, step", [
    (0.001, 0.3, 0.01), (5, 1, -0.1), (2, 2, 1), (0, 1000, 100.0), (0, 1, 0.1), (0, 10, 1.0), (1, 2, 0.1),
])
def test_example_step_gives_10_to_100_values(start, stop, step):
    assert _example_step(start, stop) == step


def test_expression_text_is_as_typed():
    assert expression_text(parse_overrides(["x=range(1, 5)"])[0]) == "range(1, 5)"
    assert expression_text(parse_overrides(["x=tag(log,interval(1,2))"])[0]) == "tag(log,interval(1,2))"


def _built(value, line, value_type=None):
    """An override as Hydra's types hold it, for values its parser never gives (the guards behind it)."""
    from hydra.core.override_parser.types import Override, OverrideType, ValueType

    return Override(type=OverrideType.CHANGE, key_or_group="x", value_type=value_type or ValueType.INTERVAL_SWEEP,
                    _value=value, input_line=line)


def test_guards_behind_hydras_parser():
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, ValueType

    with pytest.raises(SearchSpaceError) as err:
        create_param(_built(ChoiceSweep(list=[]), "x=choice()", ValueType.CHOICE_SWEEP))
    assert str(err.value) == "Search space: 'x=choice()' is an empty choice. Give at least one value." + TAIL
    with pytest.raises(SearchSpaceError) as err:
        create_param(_built(IntervalSweep(start=None, end=1.0), "x=interval(?,1)"))
    assert str(err.value) == ("Search space: 'x=interval(?,1)' is reversed or empty (low None, high 1.0). Write "
                              "interval(low, high) with low < high." + TAIL)
    # ints only when both bounds are ints
    assert create_param(_built(IntervalSweep(start=1, end=2.5), "x=interval(1,2.5)")).distribution == \
        FloatDistribution(1.0, 2.5)


def test_without_the_typed_line_the_expression_is_the_values_text():
    from hydra.core.override_parser.types import ChoiceSweep, ValueType

    value = ChoiceSweep(list=[1, 2])
    override = _built(value, None, ValueType.CHOICE_SWEEP)
    assert expression_text(override) == str(value) == create_param(override).expression
    assert str(value).startswith("ChoiceSweep(")


def test_only_plus_is_dropped_from_the_name():
    assert _param("Xx=choice(1,2)").name == "Xx"
    assert _param("++Xx=choice(1,2)").name == "Xx"


def test_a_value_that_is_no_sweep_is_refused():
    from hydra.core.override_parser.types import Override, OverrideType

    with pytest.raises(SearchSpaceError) as err:
        create_param(Override(type=OverrideType.CHANGE, key_or_group="x", value_type=None, _value="a", input_line="x=a"))
    assert str(err.value) == ("Search space: 'x=a' is a value sweep, which this sweeper cannot sample. Use "
                              "choice(...), range(...) or interval(...); glob(...) is not supported." + TAIL)
