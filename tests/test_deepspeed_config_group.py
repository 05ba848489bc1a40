"""C47: the DeepSpeed config group (zero0..zero3, none, base) ships with the package and is on every app's
Hydra search path, after the app's own config dir.

A user's app lives in ``tmp_path`` with its own ``conf/`` (no ``deepspeed/`` folder unless a test adds one):
it composes ``deepspeed=...`` through Hydra's compose API and as a real ``@hydra.main`` script in a
subprocess. The package's own config groups come from ``hydra_plugins/ds_optuna_sweeper/_conf`` and the
wheel must carry them.
"""

from __future__ import annotations

import glob
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import hydra_plugins.ds_optuna_sweeper.config as plugin_config
from tests.torchrun_utils import REPO, base_env, run_command

#: The user's ``training`` node: every value the packaged ``deepspeed/base.yaml`` interpolates.
TRAINING = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_grad_norm": 1.0,
            "learning_rate": 1e-4, "adam_beta1": 0.9, "adam_beta2": 0.99, "adam_epsilon": 1e-8,
            "weight_decay": 0.0, "bf16": False, "fp16": False}
OPTIONS = ["base", "none", "zero0", "zero1", "zero2", "zero3"]

APP = '''\
import hydra
from omegaconf import OmegaConf


@hydra.main(config_path="conf", config_name="config", version_base={version_base})
def main(cfg):
    ds = OmegaConf.to_container(cfg, resolve=True)["deepspeed"]
    print("RESULT", None if ds is None else ds["zero_optimization"]["stage"], ds and ds.get("mine"),
          ds and ds["train_micro_batch_size_per_gpu"], flush=True)


main()
'''


def make_app(root: Path, default: str = "zero2", own: dict[str, str] | None = None) -> Path:
    """A user's app dir: ``conf/config.yaml`` with ``deepspeed: <default>`` in its defaults and a
    ``training`` node; ``own`` adds ``conf/deepspeed/<name>.yaml`` files of the user's."""
    conf = root / "conf"
    conf.mkdir(parents=True)
    config = {"defaults": [{"deepspeed": default}, "_self_"], "training": TRAINING}
    (conf / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    for name, text in (own or {}).items():
        (conf / "deepspeed").mkdir(exist_ok=True)
        (conf / "deepspeed" / f"{name}.yaml").write_text(text)
    return conf


def composed(conf: Path, *overrides: str, version_base: str | None = "1.3") -> dict:
    with initialize_config_dir(config_dir=str(conf), version_base=version_base):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def test_the_group_lives_in_the_package_only():
    """One source: the package's ``_conf/deepspeed``; the repo's ``conf/`` has no copy."""
    packaged = sorted(p.stem for p in (plugin_config.PACKAGED_CONF_DIR / "deepspeed").glob("*.yaml"))
    assert packaged == OPTIONS
    assert not (REPO / "conf" / "deepspeed").exists()


@pytest.mark.parametrize("version_base", ["1.3", None])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_an_app_without_the_group_composes_each_zero_option(tmp_path, stage, version_base):
    conf = make_app(tmp_path)
    ds = composed(conf, f"deepspeed=zero{stage}", version_base=version_base)["deepspeed"]
    assert ds["zero_optimization"]["stage"] == stage
    # base.yaml came along and interpolated the user's training node
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 2
    assert ds["optimizer"]["params"]["lr"] == 1e-4


def test_an_app_without_the_group_gets_none_and_its_default(tmp_path):
    conf = make_app(tmp_path, default="zero3")
    assert composed(conf)["deepspeed"]["zero_optimization"]["stage"] == 3
    assert composed(conf, "deepspeed=none")["deepspeed"] is None


@pytest.mark.parametrize("version_base", ["1.3", None])
def test_the_apps_own_option_wins_and_may_use_the_packaged_base(tmp_path, version_base):
    """The user's ``conf/deepspeed/zero2.yaml`` replaces the packaged one (main config dir first); its
    ``defaults: [base]`` finds the packaged base; an option of its own sits beside the packaged ones."""
    own_zero2 = "defaults:\n  - base\n  - _self_\nmine: true\nzero_optimization:\n  stage: 2\n  overlap_comm: true\n"
    own_big = "defaults:\n  - zero3\n  - _self_\nmine: big\n"
    conf = make_app(tmp_path, own={"zero2": own_zero2, "big": own_big})
    ds = composed(conf, version_base=version_base)["deepspeed"]
    assert ds["mine"] is True and ds["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert ds["gradient_clipping"] == 1.0  # from the packaged base
    big = composed(conf, "deepspeed=big", version_base=version_base)["deepspeed"]
    assert big["mine"] == "big" and big["zero_optimization"]["stage"] == 3
    zero1 = composed(conf, "deepspeed=zero1", version_base=version_base)["deepspeed"]
    assert zero1["zero_optimization"] == {"stage": 1}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("version_base", ['"1.3"', "None"])
def test_a_hydra_main_app_in_its_own_dir_runs_with_deepspeed_zero3(tmp_path, version_base):
    """A real ``@hydra.main`` script, run from its own dir (cwd elsewhere), with ``deepspeed=zero3`` on the
    command line; and with its own ``zero2`` file, the default, that wins."""
    app_dir = tmp_path / "app"
    make_app(app_dir, own={"zero2": "defaults:\n  - base\n  - _self_\nmine: 7\nzero_optimization:\n  stage: 2\n"})
    (app_dir / "app.py").write_text(APP.format(version_base=version_base))
    env = base_env()
    for args, expected in ((["deepspeed=zero3"], "RESULT 3 None 4"), ([], "RESULT 2 7 4"),
                           (["deepspeed=none"], "RESULT None None None")):
        cmd = [sys.executable, str(app_dir / "app.py"), *args, f"hydra.run.dir={tmp_path / 'run'}"]
        res = run_command(cmd, timeout_s=60, cwd=tmp_path, env=env)
        assert res.returncode == 0, res.output[-3000:]
        assert expected in res.output.splitlines(), res.output[-3000:]


@pytest.mark.timeout(180)
def test_the_wheel_carries_the_group(tmp_path):
    """``pip install .`` ships ``_conf/deepspeed/*.yaml`` (package data), not just the Python files."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_text((REPO / name).read_text())
    subprocess.run(["cp", "-r", str(REPO / "hydra_plugins"), str(src)], check=True)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          str(src), "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = glob.glob(str(tmp_path / "wheel" / "*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for option in OPTIONS:
        assert f"hydra_plugins/ds_optuna_sweeper/_conf/deepspeed/{option}.yaml" in names


def test_a_training_node_with_only_the_searched_keys_gets_the_trainers_defaults(tmp_path):
    """A new user's ``training`` node holds what they set or search (found by a new-user trial: the packaged
    group's ``${training.adam_beta1}`` failed their first trial with InterpolationKeyError). Every key it
    leaves out takes ``TrainingArguments``' own default, the value the Trainer then uses too."""
    import dataclasses

    from transformers import TrainingArguments

    conf = tmp_path / "conf"
    conf.mkdir()
    config = {"defaults": [{"deepspeed": "zero2"}, "_self_"], "training": {"learning_rate": 1e-4}}
    (conf / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    ds = composed(conf)["deepspeed"]
    hf = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    assert ds["optimizer"]["params"] == {
        "lr": 1e-4, "betas": [hf["adam_beta1"], hf["adam_beta2"]], "eps": hf["adam_epsilon"],
        "weight_decay": hf["weight_decay"], "torch_adam": True}
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["gradient_clipping"],
            ds["bf16"]["enabled"], ds["fp16"]["enabled"]) == (
        hf["per_device_train_batch_size"], hf["gradient_accumulation_steps"], hf["max_grad_norm"], hf["bf16"],
        hf["fp16"])
    # a key that is set still wins
    assert composed(make_app(tmp_path / "full"))["deepspeed"]["optimizer"]["params"]["betas"] == [0.9, 0.99]
