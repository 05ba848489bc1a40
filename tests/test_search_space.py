"""Hydra sweep syntax -> Optuna distributions, and sampled values -> exact override text.

Tables for ``_study/_search_space.py`` (issue 39 item 4: rows that kill its mutants).

The rules (module docstrings): ``hydra.sweeper.params`` then the command line, one key once (the last one wins,
in command-line order; a fixed value there takes the key out of the search); non-sweep overrides pass through as
typed; a YAML list or mapping under ``params`` is refused with the expression meant (facebookresearch/hydra#2555);
a linear interval over 3 decades or more warns (case C12); the grid sampler needs finite values.
"""

import math

import optuna
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study._tell import TellResult, tell
from hydra_plugins.ds_optuna_sweeper import SearchSpaceError
from hydra_plugins.ds_optuna_sweeper._study._override_text import format_value
from hydra_plugins.ds_optuna_sweeper._study._search_space import (
    LINEAR_SPAN_WARN_DECADES,
    SearchSpace,
    build_search_space,
    span_warnings,
)
from omegaconf import OmegaConf


def _param(line):
    key, expr = line.split("=", 1)
    space = build_search_space({}, [line])
    return space.params[key.lstrip("+")]


@pytest.mark.parametrize(
    "line, expected",
    [
        # C12: interval is linear float, tag(log) log-uniform, int(interval) integer.
        ("lr=interval(1e-5,1e-3)", FloatDistribution(1e-5, 1e-3)),
        ("lr=tag(log,interval(1e-5,1e-3))", FloatDistribution(1e-5, 1e-3, log=True)),
        ("n=int(interval(1,5))", IntDistribution(1, 5)),
        ("n=tag(log,int(interval(1,64)))", IntDistribution(1, 64, log=True)),
        ("x=interval(1,5)", FloatDistribution(1.0, 5.0)),
        # C11: range stop is excluded, as in Hydra and Python.
        ("x=range(1,3)", IntDistribution(1, 2)),
        ("x=range(1,10,step=4)", IntDistribution(1, 9, step=4)),
        ("x=range(10,0,-3)", IntDistribution(1, 10, step=3)),
        ("x=range(5)", IntDistribution(0, 4)),
        ("x=choice(1,2,4)", CategoricalDistribution([1, 2, 4])),
        ("x=1,2,4", CategoricalDistribution([1, 2, 4])),
        ("x=choice(a,'b c',true,1.5)", CategoricalDistribution(["a", "b c", True, 1.5])),
        ("x=a,null,1", CategoricalDistribution(["a", None, 1])),
        ("+new=choice(x,y)", CategoricalDistribution(["x", "y"])),
    ],
)
def test_distribution_table(line, expected):
    assert _param(line).distribution == expected


def test_float_range_values_are_hydras():
    line = "x=range(0.1,0.5,0.1)"
    spec = _param(line)
    hydras = list(OverridesParser.create().parse_override(line).sweep_iterator())
    assert spec.values == tuple(hydras) and len(hydras) == 4
    assert isinstance(spec.distribution, FloatDistribution) and spec.distribution.step == pytest.approx(0.1)
    # Whatever float arithmetic Optuna uses, the override gets one of Hydra's own values.
    for k in range(4):
        assert spec.to_override_value(0.1 + k * 0.1) == hydras[k]
        assert spec.to_override_value(0.1 * (k + 1)) == hydras[k]


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("x=interval(3,1)", "reversed or empty"),
        ("x=interval(1,1)", "reversed or empty"),
        ("x=range(5,1)", "is empty"),
        ("x=range(1,5,step=0)", "step 0"),
        ("x=range(1,5,-1)", "is empty"),
        ("x=tag(log,interval(0,1))", "bound <= 0"),
        ("x=tag(log,interval(-1,1))", "bound <= 0"),
        ("x=choice()", "empty choice"),
        ("x=choice([1,2],[3])", "choice of type list"),
        ("x=glob(*)", "glob"),
        ("x=tag(log,choice(1,2))", "tag(log) on a choice"),
        # a newcomer's typo: Hydra takes any tag, and the range was swept linearly without a word
        ("x=tag(lgo,interval(1e-3,1e-1))", "the tag(s) 'lgo', which this sweeper does not read"),
        ("x=tag(Log,interval(1e-3,1e-1))", "the tag(s) 'Log'"),
        ("x=tag(log,int,interval(1,64))", "the tag(s) 'int'"),
        ("x=tag(log,grid,choice(1,2))", "the tag(s) 'grid'"),
    ],
)
def test_bad_sweeps_are_refused_with_the_expression(line, fragment):
    with pytest.raises(SearchSpaceError) as e:
        build_search_space({}, [line])
    assert fragment in str(e.value)
    assert line.split("=", 1)[0] in str(e.value)


def test_malformed_syntax_is_a_search_space_error():
    with pytest.raises(SearchSpaceError, match="Cannot parse"):
        build_search_space({}, ["x=interval(1,"])


def test_command_line_wins_over_params_and_fixed_values_pass_through():
    space = build_search_space(
        {"a": "choice(1,2)", "b": "interval(0,1)", "c": 7},
        ["a=5", "d='hello world'", "b=interval(0,2)"],
    )
    assert set(space.params) == {"b"}
    assert space.params["b"].distribution == FloatDistribution(0.0, 2.0)
    assert space.fixed == ["c=7", "a=5", "d='hello world'"]
    assert space.overrides({"b": 0.25}) == ["c=7", "a=5", "d='hello world'", "b=0.25"]


def test_grid_needs_discrete_params():
    assert build_search_space({}, ["x=range(1,10,step=4)", "y=choice(a,b)"]).grid() == {
        "x": [1, 5, 9],
        "y": ["a", "b"],
    }
    with pytest.raises(SearchSpaceError, match="continuous interval"):
        build_search_space({}, ["x=interval(0,1)"]).grid()


def test_linear_interval_over_three_decades_warns():
    assert span_warnings(build_search_space({}, ["lr=interval(1e-6,1e-3)"]))
    assert not span_warnings(build_search_space({}, ["lr=tag(log,interval(1e-6,1e-3))"]))
    assert not span_warnings(build_search_space({}, ["lr=interval(1e-4,1e-3)"]))


ROUND_TRIP_VALUES = [
    "plain",
    "with space",
    "a,b",
    "k=v",
    "it's",
    'say "hi"',
    "both ' and \"",
    "back\\slash",
    "trailing\\",
    "\\'",
    "1",
    "1.5",
    "1e-5",
    "null",
    "true",
    "False",
    "inf",
    "",
    " leading",
    "[1,2]",
    "{a: 1}",
    "choice(1,2)",
    "interval(1,2)",
    "a:b",
    "ünïcode",
    "#hash",
    "$dollar",
    0,
    -3,
    2**70,
    0.1,
    1e-5,
    1 / 3,
    -0.0,
    1e300,
    5e-324,
    float("inf"),
    float("-inf"),
    True,
    False,
    None,
]


@pytest.fixture(scope="module")
def compose_key(tmp_path_factory):
    """``compose_key(text)``: the value a task reads as ``cfg.key`` after Hydra composes an empty primary
    config with the override ``+key=<text>`` (Hydra's compose API, as a sweep job is composed)."""
    from hydra import compose, initialize_config_dir

    conf = tmp_path_factory.mktemp("conf")
    (conf / "empty.yaml").write_text("{}\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        yield lambda text: compose("empty", overrides=[f"+key={text}"]).key


@pytest.mark.parametrize("value", ROUND_TRIP_VALUES, ids=repr)
def test_override_round_trip_keeps_type_and_exact_value(value, compose_key):
    text = format_value(value)
    parsed = OverridesParser.create().parse_override(f"key={text}").value()
    # Independent of format_value's own check: what the task sees in its composed config.
    seen = compose_key(text)
    for got in (parsed, seen):
        assert type(got) is type(value), (text, got)
        if isinstance(value, float):
            assert math.copysign(1, got) == math.copysign(1, value), (text, got)
        assert got == value, (text, got)


def test_nan_round_trips(compose_key):
    parsed = OverridesParser.create().parse_override(f"key={format_value(float('nan'))}").value()
    assert isinstance(parsed, float) and math.isnan(parsed)
    seen = compose_key(format_value(float("nan")))
    assert isinstance(seen, float) and math.isnan(seen)


def _sampled_values(sampler, line, n):
    space = build_search_space({}, [line])
    study = optuna.create_study(sampler=sampler)
    seen = []
    for _ in range(n):
        trial = study.ask(fixed_distributions=space.distributions())
        name, value = next(iter(trial.params.items()))
        seen.append(space.params[name].to_override_value(value))
        if tell(study, trial, TrialState.COMPLETE, [0.0])[0] == TellResult.SAMPLER_STOP:
            break
    return seen


@pytest.mark.parametrize(
    "sampler_factory",
    [
        lambda line: optuna.samplers.RandomSampler(seed=0),
        lambda line: optuna.samplers.TPESampler(seed=0, n_startup_trials=3),
        lambda line: optuna.samplers.QMCSampler(seed=0, warn_independent_sampling=False),
        lambda line: optuna.samplers.GridSampler(build_search_space({}, [line]).grid(), seed=0),
        lambda line: optuna.samplers.BruteForceSampler(seed=0),
    ],
    ids=["random", "tpe", "qmc", "grid", "bruteforce"],
)
@pytest.mark.parametrize(
    "line, allowed", [("x=range(1,3)", {1, 2}), ("x=range(1,10,step=4)", {1, 5, 9})]
)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_c11_range_draws_exactly_hydras_values_for_every_sampler(sampler_factory, line, allowed):
    seen = _sampled_values(sampler_factory(line), line, 30)
    assert set(seen) <= allowed
    assert set(seen) == allowed  # every value is reachable (30 draws, or the whole grid)


TAIL = " (facebookresearch/hydra#2555). Nothing was asked from the study and no rank started training."


def test_params_then_the_command_line_last_one_wins():
    space = build_search_space(
        {"lr": "tag(log,interval(1e-5,1e-3))", "bs": 32, "opt": "choice(a,b)", "w": "interval(1e-4,0.1)"},
        ["opt=sgd", "+d=range(1,4)", "seed=1", "bs=choice(8,16)", "~k"])
    assert list(space.params) == ["lr", "w", "d", "bs"]
    assert space.fixed == ["opt=sgd", "seed=1", "~k"]
    assert space.distributions() == {"lr": FloatDistribution(1e-5, 1e-3, log=True), "w": FloatDistribution(1e-4, 0.1),
                                     "d": IntDistribution(1, 3), "bs": CategoricalDistribution([8, 16])}
    assert space.params["d"].key == "+d" and space.params["bs"].expression == "choice(8,16)"
    assert space.describe() == ["lr: float in [1e-05, 0.001], log  <- tag(log,interval(1e-5,1e-3))",
                                "w: float in [0.0001, 0.1]  <- interval(1e-4,0.1)",
                                "d: int in [1, 3]  <- range(1,4)",
                                "bs: one of [8, 16]  <- choice(8,16)"]
    # fixed overrides first, then one line per param, the key as typed; others by name
    assert space.overrides({"lr": 1e-4, "bs": 8, "d": 2, "custom": 0.5}) == [
        "opt=sgd", "seed=1", "~k", "lr=0.0001", "bs=8", "+d=2", "custom=0.5"]
    assert space.param_lines({"bs": 16}) == ["bs=16"]


@pytest.mark.parametrize("params, arguments, names, fixed", [
    ({"a": 1.5, "b": None, "c": "x y"}, ["+a=2"], [], ["b=null", "c=x y", "+a=2"]),  # plain YAML values are fixed
    ({"x": "choice(1,2)"}, ["x=3"], [], ["x=3"]),           # a fixed value on the command line takes x out
    ({}, ["a=1", "a=choice(1,2)", "b=2"], ["a"], ["b=2"]),
    ({"a": "choice(1,2)"}, ["b=1", "++a=choice(3,4)"], ["a"], ["b=1"]),
    (None, [], [], []),
    ({"k": True}, [], [], ["k=true"]),
    (None, ["Xa=1", "a=choice(1,2)", "+Xa=2"], ["a"], ["+Xa=2"]),  # only + is dropped from the name
])
def test_build_search_space(params, arguments, names, fixed):
    space = build_search_space(params, arguments)
    assert list(space.params) == names and space.fixed == fixed


@pytest.mark.parametrize("params, message", [
    ({"a": [1, "x y"]}, "hydra.sweeper.params takes Hydra sweep expressions (strings), but 'a' is a YAML list "
                        "([1, 'x y']). Write 'a: choice(1, x y)'"),
    (OmegaConf.create({"a": {"b": 1}, "z": "choice(1,2)", "c": [True, None]}),
     "hydra.sweeper.params takes Hydra sweep expressions (strings), but 'a' is a YAML mapping ({'b': 1}); 'c' is a "
     "YAML list ([True, None]). Write 'a: <a sweep expression such as choice(...) or interval(...)>', "
     "'c: choice(true, null)'"),
    ({"a": (1, 2)}, "hydra.sweeper.params takes Hydra sweep expressions (strings), but 'a' is a YAML list ((1, 2)). "
                    "Write 'a: choice(1, 2)'"),
    ({"a": [b"x"]}, "hydra.sweeper.params takes Hydra sweep expressions (strings), but 'a' is a YAML list "
                    "([b'x']). Write 'a: choice(...)'"),
    ({"a": [{"1": "x"}]}, "hydra.sweeper.params takes Hydra sweep expressions (strings), but 'a' is a YAML list "
                          "([{'1': 'x'}]). Write 'a: choice(...)'"),
    ({"a": {}}, "hydra.sweeper.params takes Hydra sweep expressions (strings), but 'a' is a YAML mapping ({}). "
                "Write 'a: <a sweep expression such as choice(...) or interval(...)>'"),
])
def test_a_yaml_container_under_params_is_refused(params, message):
    with pytest.raises(SearchSpaceError) as err:
        build_search_space(params, ["x=1"])
    assert str(err.value) == message + TAIL


def test_a_refused_line_names_where_it_came_from():
    with pytest.raises(SearchSpaceError, match=r"^Cannot parse the sweep override 'lr=interval\(' "
                                               r"\(hydra.sweeper.params.lr\): "):
        build_search_space({"lr": "interval("}, [])
    with pytest.raises(SearchSpaceError, match=r"^Cannot parse the sweep override 'x=\[' \(the command line\): "):
        build_search_space({"lr": "interval(0,1)"}, ["a=1", "x=["])


def test_grid():
    space = build_search_space(None, ["a=choice(x,y)", "b=range(1,4)"])
    assert space.grid() == {"a": ["x", "y"], "b": [1, 2, 3]}
    assert SearchSpace().grid() == {}
    with pytest.raises(SearchSpaceError) as err:
        build_search_space(None, ["a=choice(x,y)", "+lr=tag(log,interval(1e-5,1e-3))"]).grid()
    assert str(err.value) == ("The grid sampler needs finite values, but '+lr=tag(log,interval(1e-5,1e-3))' is a "
                              "continuous interval. Use choice(...) or range(...) for it, or another sampler.")


@pytest.mark.parametrize("line, warning", [
    ("w=interval(1e-3,1)", "'w=interval(1e-3,1)' is linear but spans 3.0 decades: most draws land near the top. "
                           "Write 'w=tag(log, interval(1e-3,1))' for a log-uniform search (silence this by "
                           "narrowing the interval)."),
    ("+w=interval(1e-5,0.5)", "'+w=interval(1e-5,0.5)' is linear but spans 4.7 decades: most draws land near the "
                              "top. Write '+w=tag(log, interval(1e-5,0.5))' for a log-uniform search (silence this "
                              "by narrowing the interval)."),
    ("v=interval(1e-3,0.99)", None),            # under 3 decades
    ("u=interval(0,1)", None),                  # low 0: no decades
    ("n=interval(-1,1000)", None),
    ("l=tag(log,interval(1e-5,1))", None),      # already log
    ("t=range(0.001,10,step=1.0)", None),       # stepped
    ("i=int(interval(1,10000))", None),         # int
])
def test_span_warnings(line, warning):
    assert span_warnings(build_search_space(None, [line])) == ([warning] if warning else [])


def test_span_warn_decades_is_3():
    assert LINEAR_SPAN_WARN_DECADES == 3
