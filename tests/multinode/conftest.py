"""The ``two_hosts`` fixture: two network namespaces joined by one link (``tests/multinode/netns.py``)."""

import itertools
import os

import pytest

from tests.multinode.netns import make_two_hosts, why_not

_COUNT = itertools.count()


@pytest.fixture
def two_hosts():
    """Hosts ``a`` and ``b`` (:class:`tests.multinode.netns.TwoHosts`), named after this process's pid and a
    counter (unique across pytest-xdist workers), torn down after the test however it ends: every process in
    both namespaces killed, the namespaces deleted. Skips, saying why, where namespaces cannot be made."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    n = next(_COUNT)
    hosts = make_two_hosts(f"{os.getpid()}n{n}", subnet=n % 256)
    try:
        yield hosts
    finally:
        hosts.teardown()
