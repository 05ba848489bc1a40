"""Case C44, the whole kind: a typo in a config group name anywhere in the search space gets "did you
mean", never ``+name=`` advice (which would add a junk key or name a group that does not exist).

The config dir is built here: nested groups (``model/encoder`` selected, ``model/decoder`` not) and a
group outside the defaults list (``optimizer``, with a nested ``optimizer/schedule``). The config and
``group_options`` come from Hydra's real config loader, as the sweeper builds them.
"""

from __future__ import annotations

import pytest

from hydra_plugins.ds_optuna_sweeper._errors import SearchSpaceError
from hydra_plugins.ds_optuna_sweeper._study._search_space import build_search_space
from hydra_plugins.ds_optuna_sweeper._study._space_checks import check_param_keys
from tests.hydra_config import composed_with_group_options

FILES = ["model/tiny", "model/encoder/small", "model/encoder/big", "model/decoder/d1", "optimizer/adam",
         "optimizer/sgd", "optimizer/schedule/cos", "optimizer/schedule/lin"]
APP = "defaults:\n  - model: tiny\n  - model/encoder: small\n  - _self_\nlr: 0.1\n"


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    conf = tmp_path_factory.mktemp("conf")
    for name in FILES:
        (conf / f"{name}.yaml").parent.mkdir(parents=True, exist_ok=True)
        (conf / f"{name}.yaml").write_text("v: 1\n")
    (conf / "app.yaml").write_text(APP)
    yield from composed_with_group_options(conf, "app")


@pytest.mark.parametrize("line, meant", [
    ("model/encodr=choice(small,big)", "'model/encoder'"),         # nested: a typo in the last part
    ("modl/encoder=choice(small,big)", "'model/encoder'"),         # nested: a typo in the first part
    ("model/decodr=choice(d1)", "'+model/decoder'"),                # nested, not in the defaults list
    ("optimzer/schedule=choice(cos,lin)", "'+optimizer/schedule'"),  # the parent not in the defaults list
    ("optimizer/schedul=choice(cos,lin)", "'+optimizer/schedule'"),
    ("model.decodr=choice(d1)", "'+model/decoder'"),                # dotted, meaning a group below a key
    ("optimzer=choice(adam,sgd)", "'+optimizer'"),                  # top level, not in the defaults list
    ("modle=choice(tiny)", "'model'"),                              # top level, selected
])
def test_c44_a_group_typo_names_the_group_meant_never_the_plus_form_of_the_typo(nested, line, meant):
    cfg, group_options = nested
    key = line.split("=", 1)[0]
    with pytest.raises(SearchSpaceError) as e:
        check_param_keys(build_search_space({}, [line]), cfg, group_options)
    text = str(e.value)
    assert f"did you mean {meant}?" in text, text
    assert f"'+{key}'" not in text and f"+{key}=" not in text and "to add it" not in text, text


@pytest.mark.parametrize("line, listed", [
    ("foo/bar=choice(a,b)", "'foo/bar' is not a config group (config groups at the top: ['deepspeed', 'hydra', "
                            "'model', 'optimizer'])"),
    ("model/encoder/x=choice(a)", "'model/encoder/x' is not a config group (no config group below 'model/encoder')"),
])
def test_c44_a_group_path_with_nothing_close_lists_the_groups_there(nested, line, listed):
    cfg, group_options = nested
    with pytest.raises(SearchSpaceError) as e:
        check_param_keys(build_search_space({}, [line]), cfg, group_options)
    assert listed in str(e.value) and "+" not in str(e.value).split("Nothing was asked")[0], str(e.value)


def test_c44_right_group_names_pass(nested):
    cfg, group_options = nested
    check_param_keys(build_search_space({}, ["model/encoder=choice(small,big)", "model=choice(tiny)",
                                             "+model/decoder=choice(d1)", "lr=interval(0,1)"]), cfg, group_options)
