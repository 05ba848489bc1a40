"""The example app's sweep config stays in step with its training defaults."""

from hydra import compose, initialize_config_dir

from tests.torchrun_utils import REPO


def test_enqueued_default_trial_is_the_default_config():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", return_hydra_config=True)
    queued = cfg.hydra.sweeper.enqueue_trials[0]
    for key, value in queued.items():
        section, name = key.split(".", 1)
        assert cfg[section][name] == value, key
    assert set(queued) == set(cfg.hydra.sweeper.params)
    assert cfg.hydra.sweeper.direction == "maximize"
