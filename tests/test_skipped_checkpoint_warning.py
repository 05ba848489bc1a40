"""A checkpoint the convention skips is named, not passed over in silence (issue 38, C58).

A task that saved ``checkpoint-<step>/model.pt`` (its own layout, no ``trainer_state.json``) resumed from step 0
after SIGTERM with no word that its checkpoint was skipped. :func:`latest_checkpoint` (what a retry resumes from,
rank 0) now warns naming the directory and what the convention needs.
"""

import logging
from pathlib import Path

from hydra_plugins.ds_optuna_sweeper._task import _checkpoints

LOGGER = "hydra_plugins.ds_optuna_sweeper._task._checkpoints"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_an_own_layout_checkpoint_dir_is_named_with_what_the_convention_needs(tmp_path: Path, caplog) -> None:
    (tmp_path / "checkpoint-40").mkdir()
    (tmp_path / "checkpoint-40" / "model.pt").write_bytes(b"weights")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _checkpoints.latest_checkpoint(str(tmp_path)) is None
    (text,) = _warnings(caplog)
    assert str(tmp_path / "checkpoint-40") in text and "trainer_state.json" in text and "from the start" in text


def test_a_skipped_checkpoint_newer_than_the_chosen_one_is_named_and_an_older_one_is_not(tmp_path: Path, caplog) -> None:
    for step in (10, 30):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-20").mkdir()  # older than the chosen one: irrelevant
    (tmp_path / "checkpoint-50").mkdir()  # newer, skipped: named
    (tmp_path / "step=60.ckpt").write_bytes(b"")  # an empty file: named
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _checkpoints.latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-30")
    texts = _warnings(caplog)
    assert len(texts) == 2, texts
    assert str(tmp_path / "checkpoint-50") in texts[0] and str(tmp_path / "checkpoint-30") in texts[0]
    assert str(tmp_path / "step=60.ckpt") in texts[1] and "not empty" in texts[1]


def test_complete_checkpoints_only_say_nothing(tmp_path: Path, caplog) -> None:
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text("{}")
    (tmp_path / "epoch=0-step=5.ckpt").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert _checkpoints.latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")
        assert _checkpoints.latest_checkpoint(str(tmp_path / "missing")) is None
    assert _warnings(caplog) == []
