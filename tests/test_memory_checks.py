"""The oracle of C14's memory criteria (``tests/multirank/memory_checks.py``): a leak fails it, warm-up and a
count that is back down by the next probe do not, so the multirank memory tests can fail and do not flake."""

import pytest

from tests.multirank.memory_checks import assert_memory_flat, assert_no_object_growth


def _series(values: list[int]) -> dict[str, list[int]]:
    return {"tensors": values}


@pytest.mark.parametrize("values", [
    [1, 1, 1, 1, 1],
    [1, 1, 1, 4, 1, 1],  # seen on a fresh install: rank 1, after one pruned trial of twelve
    [5, 1, 1, 1],  # warm-up: the first probe may be higher
])
def test_no_leak_passes(values):
    assert_no_object_growth(_series(values), 1, "rank 0", keys=("tensors",))


@pytest.mark.parametrize("values", [
    [1, 2, 3, 4, 5],  # one more per trial
    [1, 1, 1, 4, 4, 4],  # one trial left three behind for good
    [1, 1, 1, 1, 4],  # the last trial left something behind
    [1, 4, 1, 4, 4, 1],  # two probes in a row above
])
def test_a_leak_fails(values):
    with pytest.raises(AssertionError, match="live tensors per trial"):
        assert_no_object_growth(_series(values), 1, "rank 0", keys=("tensors",))


def test_memory_flat_takes_the_warm_up_and_fails_a_slope():
    assert_memory_flat([189.0, 202.4, 202.4, 202.8], [650, 660, 660, 661], "rank 0")
    with pytest.raises(AssertionError, match="glibc heap in use"):
        assert_memory_flat([189.0, 190.0, 200.0, 210.0], [650, 650, 650, 650], "rank 0")
    with pytest.raises(AssertionError, match="RSS per trial"):
        assert_memory_flat([189.0, 190.0, 190.0, 190.0], [600, 620, 640, 660], "rank 0")
