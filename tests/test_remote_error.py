"""One way for errors to cross ranks (issue 22, item 4): ``RemoteError`` rebuilds the same type and message."""

import pickle

import pytest

from hydra_plugins.ds_optuna_sweeper._errors import (
    CallMismatchError,
    DSOptunaSweeperError,
    GlueConfigError,
    PeerLostError,
    RankTimeoutError,
    RemoteError,
    SearchSpaceError,
    StorageUnavailableError,
    SweeperConfigError,
    SweepStoppedError,
    TrialFailedError,
)


def _across(exc: BaseException, rank: int = 0) -> BaseException:
    """``exc`` as another rank raises it: built into a RemoteError, pickled (as a broadcast does), rebuilt."""
    return pickle.loads(pickle.dumps(RemoteError.from_exception(exc, rank))).to_exception()


@pytest.mark.parametrize("cls", [SweeperConfigError, SearchSpaceError, SweepStoppedError, PeerLostError,
                                 GlueConfigError, TrialFailedError, DSOptunaSweeperError])
def test_a_package_error_keeps_its_type_and_message(cls):
    got = _across(cls("the message"))
    assert type(got) is cls and str(got) == "the message"


def test_except_clauses_of_callers_keep_working_on_every_rank():
    with pytest.raises(SweeperConfigError):  # and ValueError, as before
        RemoteError.from_exception(SweeperConfigError("bad"), 0).raise_here()
    assert isinstance(_across(SweeperConfigError("bad")), ValueError)
    assert isinstance(_across(PeerLostError("gone")), RankTimeoutError)  # and TimeoutError
    assert isinstance(_across(SweepStoppedError("ask failed")), TrialFailedError)
    assert isinstance(_across(GlueConfigError("bad metric")), ValueError)


def test_an_error_with_its_own_constructor_keeps_type_and_text():
    outage = StorageUnavailableError("sqlite:///x.db", 3.0, 4, "OperationalError: locked", resume="python app.py -m")
    got = _across(outage)
    assert type(got) is StorageUnavailableError and str(got) == str(outage)
    mismatch = _across(CallMismatchError("rank 1 did not report", rank=1, call="report(step=3)", trial=2))
    assert type(mismatch) is CallMismatchError and str(mismatch) == "rank 1 did not report"


def test_a_foreign_error_becomes_the_base_class_naming_its_type():
    remote = RemoteError.from_exception(ModuleNotFoundError("No module named 'cmaes'"), 0)
    got = remote.to_exception()
    assert type(got) is DSOptunaSweeperError
    assert str(got) == "ModuleNotFoundError: No module named 'cmaes'" == str(remote)


def test_it_is_a_frozen_value_with_the_sending_rank():
    remote = RemoteError.from_exception(SweeperConfigError("bad"), 1)
    assert remote == RemoteError("SweeperConfigError", "bad", 1)
    with pytest.raises(AttributeError):
        remote.rank = 0  # type: ignore[misc]
