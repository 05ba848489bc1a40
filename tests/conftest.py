"""Shared fixtures: restore the environment and the trial slot after every test."""

import os

import pytest


@pytest.fixture(autouse=True)
def _restore_env_and_slot():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    from hydra_plugins.ds_optuna_sweeper._trial import _reset_for_tests

    _reset_for_tests()
