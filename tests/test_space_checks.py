"""Tables for ``_study/_space_checks.py`` (issue 39 item 4: rows that kill its mutants).

The rules (module docstrings, cases C22 and C44): a ``choice``/``range`` over a config group names each missing
option; a searched key the config lacks is refused, naming the close key or group meant (difflib ratio 0.8) or
else the ``+key=...`` form; ``+``/``~`` keys, packages (``@``), config groups in the defaults list and keys
below a searched group are left to Hydra; a group missing from the defaults list needs ``+``.
A fake config repository stands in for Hydra's: top-level groups db, deepspeed, hydra, model; model/encoder.
"""

import pytest
from omegaconf import OmegaConf

from hydra_plugins.ds_optuna_sweeper._errors import SearchSpaceError, SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space
from hydra_plugins.ds_optuna_sweeper._study._space_checks import (
    CLOSE_KEY_CUTOFF,
    _chosen_groups,
    _groups_below,
    _options_of,
    _unknown_key_problems,
    check_baseline_keys,
    check_group_options,
    check_param_keys,
)

GROUPS = {"": ["db", "deepspeed", "hydra", "model"], "model": ["encoder"], "model/encoder": ["enc1", "enc2", "enc3", "enc4"]}
OPTIONS = {"model": ["large", "small"], "model/encoder": ["a", "b"], "deepspeed": ["zero0", "zero1"], "db": ["mysql"]}
TAIL = ". Nothing was asked from the study and no rank started training."


def repo(path, groups=False):
    """Hydra's ``get_group_options``: the options of a group, or with ``groups=True`` the groups below a path."""
    return GROUPS.get(path, []) if groups else OPTIONS.get(path, [])


CFG = OmegaConf.create({"lr": 0.1, "model": {"name": "small", "layers": [1, 2], "opt": {"beta": 0.9}},
                        "trainer": {"epochs": 1},
                        "hydra": {"runtime": {"choices": {"model": "small", "deepspeed": "zero0",
                                                          "model/encoder": "a"}}}})


def _did_you_mean(key, *fixes):
    return f"'{key}' is not a key or config group of the task's config (did you mean {' or '.join(fixes)}?)"


def _plus(key):
    return f"'{key}' is not a key of the task's config (write '+{key}=...' to add it)"


@pytest.mark.parametrize("key, problem", [
    ("lr", None), ("+xx", None), ("~lr", None), ("a@b", None), ("model", None), ("model.name", None),
    ("model.layers.0", None), ("model.name.x", None), ("trainer.epochs", None), ("lr.x", None),
    ("model/encoder", None),
    ("lrr", _did_you_mean("lrr", "'lr'")),
    ("xx", _plus("xx")),                                     # nothing close: add it with +
    ("mdl", _plus("mdl")),
    ("db", "'db' is a config group that is not in the defaults list (write '+db=...' to add it)"),
    ("deepspeeed", _did_you_mean("deepspeeed", "'deepspeed'")),  # C44
    ("modle", _did_you_mean("modle", "'model'")),
    ("dbb", _did_you_mean("dbb", "'+db'")),                  # a group the defaults list lacks: +db
    ("model.nmae", _plus("model.nmae")),                     # name/nmae: ratio 0.75, under the cutoff
    ("model.opt.betaa", _did_you_mean("model.opt.betaa", "'model.opt.beta'")),
    ("model.encoder", _did_you_mean("model.encoder", "'model/encoder'")),  # a group below: written as its path
    ("model.encodr", _did_you_mean("model.encodr", "'model/encoder'")),
    ("trainr.epochs", _did_you_mean("trainr.epochs", "'trainer.epochs'")),
    ("deepspeed.stage", _plus("deepspeed.stage")),           # the only close name is the key itself
    ("model/encodr", "'model/encodr' is not a config group (did you mean 'model/encoder'?)"),
    ("modl/encoder", "'modl/encoder' is not a config group (did you mean 'model/encoder'?)"),
    ("dbb/x", "'dbb/x' is not a config group (did you mean '+db/x'?)"),
    ("nothing/x", "'nothing/x' is not a config group (config groups at the top: ['db', 'deepspeed', 'hydra', "
                  "'model'])"),
    ("model/encoder/zz", "'model/encoder/zz' is not a config group (config groups below 'model/encoder': ['enc1', "
                         "'enc2', 'enc3', 'enc4'])"),
    ("model/encoder/enc1/x", "'model/encoder/enc1/x' is not a config group (no config group below "
                             "'model/encoder/enc1')"),
    # 3 of the 4 equally close (difflib's order: best first, ties last name first), joined by 'or'; a group the
    # defaults list lacks needs +
    ("model/encoder/enc", "'model/encoder/enc' is not a config group (did you mean '+model/encoder/enc4' or "
                          "'+model/encoder/enc3' or '+model/encoder/enc2'?)"),
    ("mdl/encoder", "'mdl/encoder' is not a config group (config groups at the top: ['db', 'deepspeed', 'hydra', "
                    "'model'])"),                            # mdl/model: ratio 0.75, under the cutoff
    ("hydr", _plus("hydr")),                                 # the config's hydra node is never suggested
    ("model/xyz", "'model/xyz' is not a config group (config groups below 'model': ['encoder'])"),
    ("hydraa/x", "'hydraa/x' is not a config group (config groups at the top: ['db', 'deepspeed', 'hydra', "
                 "'model'])"),                               # hydra is never suggested
])
def test_unknown_key_problems(key, problem):
    assert _unknown_key_problems([key], CFG, repo) == ([problem] if problem else [])


@pytest.mark.parametrize("keys, problems", [
    (["+a", "~b", "x@y", "xx"], [_plus("xx")]),             # each key is checked, whatever precedes it
    (["deepspeed", "deepspeed.stage", "xx"], [_plus("xx")]),
    (["model", "xx"], [_plus("xx")]),
    (["Xq"], [_plus("Xq")]),                                 # only a leading + or ~ leaves a key to Hydra
])
def test_every_key_is_checked(keys, problems):
    assert _unknown_key_problems(keys, CFG, repo) == problems


CFG_ENCODER = OmegaConf.create({"model": {"encoder": {"size": 1}}, "lr1": 1, "lr2": 2, "lr3": 3, "lr4": 4,
                                "hydra": {"runtime": {"choices": {"model": "small"}}}})


@pytest.mark.parametrize("key, problem", [
    # a group below model/encoder meant at depth 2: written as its path, + where the defaults list lacks it
    ("model.encoder.enc", _did_you_mean("model.encoder.enc", "'+model/encoder/enc4'", "'+model/encoder/enc3'",
                                        "'+model/encoder/enc2'")),
    ("lr", _did_you_mean("lr", "'lr4'", "'lr3'", "'lr2'")),   # 3 of the 4 close keys
])
def test_close_names_at_depth(key, problem):
    assert _unknown_key_problems([key], CFG_ENCODER, repo) == [problem]


def test_keys_below_a_searched_group_are_left_to_hydra():
    assert _unknown_key_problems(["deepspeed", "deepspeed.stage"], CFG, repo) == []
    assert _unknown_key_problems(["db", "db.port"], CFG, repo) == [
        "'db' is a config group that is not in the defaults list (write '+db=...' to add it)"]


def test_without_a_defaults_list_every_group_is_taken_as_chosen():
    cfg = OmegaConf.create({"lr": 0.1})
    assert _unknown_key_problems(["db", "dbb", "dbb/x"], cfg, repo) == [
        _did_you_mean("dbb", "'db'"), "'dbb/x' is not a config group (did you mean 'db/x'?)"]


@pytest.mark.parametrize("group_options, problems", [
    (None, []),                                              # no loader: group paths are left to Hydra
    (lambda path: [], ["'model/encodr' is not a config group (no config group at the top)"]),  # none listed
])
def test_without_a_config_loader(group_options, problems):
    assert _unknown_key_problems(["lrr", "model/encodr", "modle"], CFG, group_options) == [
        _did_you_mean("lrr", "'lr'"), *problems, _did_you_mean("modle", "'model'")]


@pytest.mark.parametrize("config, chosen", [
    (CFG, {"model", "deepspeed", "model/encoder"}),
    (OmegaConf.create({"hydra": {"runtime": {"choices": {"a": None}}}}), {"a"}),
    (OmegaConf.create({"lr": 1}), None),
    (None, None),
])
def test_chosen_groups(config, chosen):
    assert _chosen_groups(config) == chosen


def _raises(*args, **kwargs):
    raise ValueError("not a group")


@pytest.mark.parametrize("path, group_options, below", [
    ("model.x", lambda p, groups=False: [p, groups], ["model/x", "True"]),   # dotted -> path, groups=True
    ("", lambda p: ["x"], []),                                               # no groups keyword
    ("", None, []),
    ("", _raises, []),
    ("", lambda p, groups=False: None, []),
])
def test_groups_below(path, group_options, below):
    assert _groups_below(path, group_options) == below


@pytest.mark.parametrize("group, group_options, options", [
    ("model", repo, ["large", "small"]),
    ("lr", repo, []),
    ("model", None, []),
    ("model", _raises, []),
    ("model", lambda g: None, []),
])
def test_options_of(group, group_options, options):
    assert _options_of(group, group_options) == options


def test_close_key_cutoff():
    assert CLOSE_KEY_CUTOFF == 0.8


@pytest.mark.parametrize("lines, message", [
    (["model=choice(small,large)"], None),
    (["model=interval(0,1)"], None),                         # no values: not checked
    (["lr=choice(1,2)"], None),                              # not a group
    (["deepspeed=zero0,null"], None),                        # null: no option needed
    (["model=choice(small,huge,tiny)", "+db=choice(mysql,pg)", "lr=choice(1,2)"],
     "Search space: 'model=choice(small,huge,tiny)': no option ['huge', 'tiny'] in config group 'model' (available: "
     "['large', 'small']); '+db=choice(mysql,pg)': no option ['pg'] in config group 'db' (available: ['mysql']). "
     "Add the config file(s) or remove the option(s)"),
    (["model@m=choice(x)"], "Search space: 'model@m=choice(x)': no option ['x'] in config group 'model' "
                            "(available: ['large', 'small']). Add the config file(s) or remove the option(s)"),
    (["~model=choice(x)"], "Search space: '~model=choice(x)': no option ['x'] in config group 'model' "
                           "(available: ['large', 'small']). Add the config file(s) or remove the option(s)"),
    (["db=range(1,3)"], "Search space: 'db=range(1,3)': no option [1, 2] in config group 'db' (available: "
                        "['mysql']). Add the config file(s) or remove the option(s)"),
    # every param is checked, whatever comes before it
    (["lr=choice(1,2)", "x=interval(0,1)", "db=choice(pg)"],
     "Search space: 'db=choice(pg)': no option ['pg'] in config group 'db' (available: ['mysql']). Add the config "
     "file(s) or remove the option(s)"),
    (["x=interval(0,1)", "db=choice(pg)"],
     "Search space: 'db=choice(pg)': no option ['pg'] in config group 'db' (available: ['mysql']). Add the config "
     "file(s) or remove the option(s)"),
    (["Xdb=choice(pg)"], None),                              # not the group db: only + and ~ are dropped
])
def test_check_group_options(lines, message):
    space = build_search_space(None, lines)
    if message is None:
        check_group_options(space, repo)
    else:
        with pytest.raises(SearchSpaceError) as err:
            check_group_options(space, repo)
        assert str(err.value) == message + TAIL


def test_check_param_keys():
    check_param_keys(build_search_space(None, ["lr=choice(1,2)", "+new=choice(1,2)"]), CFG, repo)
    with pytest.raises(SearchSpaceError) as err:
        check_param_keys(build_search_space(None, ["lrr=choice(1,2)", "xx=choice(1,2)", "dbb=choice(1,2)"]), CFG,
                         repo)
    assert str(err.value) == ("Search space: " + _did_you_mean("lrr", "'lr'") + "; " + _plus("xx") + "; "
                              + _did_you_mean("dbb", "'+db'") + TAIL)  # the group db, from the config repository


def test_check_baseline_keys():
    check_baseline_keys([("a", ["lr=1", "model.name=x"])], CFG, repo)
    with pytest.raises(SweeperConfigError) as err:
        check_baseline_keys([("a", ["lr=1"]), ("b", ["seed=2", "lrr=1=2", "dbb=1"]), ("c", ["xx=1"])], CFG, repo)
    assert str(err.value) == ("hydra.sweeper.refit.baselines.b: " + _plus("seed") + "; " + _did_you_mean("lrr", "'lr'")
                              + "; " + _did_you_mean("dbb", "'+db'") + TAIL)
