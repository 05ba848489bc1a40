"""An exception raised by Optuna on rank 0 inside a ``RankTrial`` call crosses to the other ranks as a
``RemoteError`` (type name, message, rank) and is raised there again: the same type and message where
the type can be rebuilt from them (``_handle._rebuilt``). Rank 0 raises the exception itself.
"""

import pytest

import optuna

from hydra_plugins.ds_optuna_sweeper import _errors
from hydra_plugins.ds_optuna_sweeper._errors import RemoteError
from hydra_plugins.ds_optuna_sweeper._task._handle import RankTrial, _rebuilt
from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm


def _crossed(exc):
    """``exc`` as a peer rank raises it: sent from rank 0 as a RemoteError, rebuilt."""
    return _rebuilt(RemoteError.from_exception(exc, 0))


@pytest.mark.parametrize("exc", [
    ValueError("The `low` value must be smaller than or equal to the `high` value (low=2, high=1)."),
    NotImplementedError("multi-objective"),
    KeyboardInterrupt(),
    optuna.TrialPruned("pruned at step 3"),
    optuna.exceptions.UpdateFinishedTrialError("trial 2 is already finished"),
    _errors.RankTimeoutError("rank 1/2 waited 30 s for rank 0"),
    _errors.StorageUnavailableError("postgresql://u:***@h/db", 12.0, 4, "OperationalError: closed"),
], ids=lambda e: type(e).__name__)
def test_the_same_type_and_message_on_the_other_ranks(exc):
    got = _crossed(exc)
    assert type(got) is type(exc) and str(got) == str(exc)


@pytest.mark.parametrize("cls, code", [(_errors.Interrupted, 130), (_errors.Preempted, 143), (SystemExit, 1)])
def test_an_exit_keeps_its_code_as_an_int(cls, code):
    got = _crossed(cls(code))
    assert type(got) is cls and got.code == code


def test_a_type_that_cannot_be_rebuilt_becomes_the_package_base_error_naming_it():
    class LocalOnly(Exception):
        pass

    for exc, name in ((LocalOnly("boom"), "LocalOnly"), (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), "UnicodeDecodeError")):
        got = _crossed(exc)
        assert type(got) is _errors.DSOptunaSweeperError and str(got).startswith(f"{name}: "), got


def test_rank_0_raises_optunas_own_exception_with_its_traceback():
    """World size 1 (rank 0 alone): the exception is Optuna's own object, not a rebuilt copy."""
    study = optuna.create_study()
    live = study.ask()
    trial = RankTrial(live.number, {}, RankComm(), live)
    with pytest.raises(ValueError, match="low") as info:
        trial.suggest_float("x", 2.0, 1.0)
    assert any("optuna" in entry.path.as_posix() for entry in info.traceback)
