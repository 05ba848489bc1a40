"""Tables for ``_study/_search_space.py`` (issue 39 item 4: rows that kill its mutants).

The rules (module docstrings): ``hydra.sweeper.params`` then the command line, one key once (the last one wins,
in command-line order; a fixed value there takes the key out of the search); non-sweep overrides pass through as
typed; a YAML list or mapping under ``params`` is refused with the expression meant (facebookresearch/hydra#2555);
a linear interval over 3 decades or more warns (case C12); the grid sampler needs finite values.
"""

import pytest
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hydra_plugins.ds_optuna_sweeper._errors import SearchSpaceError
from hydra_plugins.ds_optuna_sweeper._study._search_space import (
    LINEAR_SPAN_WARN_DECADES,
    SearchSpace,
    build_search_space,
    span_warnings,
)

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
