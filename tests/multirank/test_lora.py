"""LoRA fine-tuning with PEFT (examples/lora_finetune.py, conf/lora.yaml; docs/how-to/lora.md): a 2-rank sweep of
the adapters' rank, alpha and dropout and the learning rate, HF Trainer + DeepSpeed ZeRO-2 on CPU/gloo."""

import re

import optuna
import pytest
from optuna.trial import TrialState

from tests.torchrun_utils import run_torchrun

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]

SEARCHED = {"lora.r", "lora.lora_alpha", "lora.lora_dropout", "training.learning_rate"}


@pytest.mark.soak  # 58 s of 2 cores: under make soak (CI runs it) to keep make test within 12 min
def test_lora_sweep_searches_the_adapters_from_one_config_on_two_ranks(tmp_path):
    """Two trials on a 64-question slice: both COMPLETE with the four searched params, each trial's rank 0
    trains the adapters it was given (its printed rank and alpha are the trial's) and only a small share of
    the weights, and both ranks ran each trial (one job log per rank)."""
    sweep = tmp_path / "sweep"
    res = run_torchrun("examples/lora_finetune.py", [
        "-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "data.train_size=64", "data.eval_size=32",
        "hydra.sweeper.plots=false"], timeout_s=240)
    res.check()
    study = optuna.load_study(study_name="lora", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    printed = re.findall(r"LoRA r=(\d+) alpha=(\d+): ([\d,]+) of ([\d,]+) parameters trained", res.output)
    assert len(printed) == 2, res.output[-3000:]
    for trial, (r, alpha, trained, total) in zip(study.trials, printed):
        assert set(trial.params) == SEARCHED
        assert (int(r), int(alpha)) == (trial.params["lora.r"], trial.params["lora.lora_alpha"])
        assert int(trained.replace(",", "")) < 0.01 * int(total.replace(",", ""))
        for rank in (0, 1):
            assert (sweep / str(trial.number) / f"lora_finetune_rank{rank}.log").is_file()
