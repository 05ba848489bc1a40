"""The kernel deadline on a rank's connections to torchrun's store (``_comm/_tcp_deadline.py``, issue 42): set on a
real ``TCPStore`` client's connection, and only on connections to the store's port. What it is for (a link that
stays down: the store call raises instead of waiting) runs across network namespaces in
``tests/multinode/test_lost_node.py::test_link_cut_mid_trial[stays_down]``."""

import datetime
import os
import socket

import pytest
import torch.distributed as dist

from hydra_plugins.ds_optuna_sweeper._comm._tcp_deadline import _socket_fds, bound_store_connections

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux only (TCP_USER_TIMEOUT)")


def _user_timeouts(port: int) -> list[int]:
    """``TCP_USER_TIMEOUT`` (ms) of each of this process's TCP connections to ``port``."""
    out = []
    for fd in _socket_fds():
        sock = socket.socket(fileno=os.dup(fd))
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername()[1] == port:
                out.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
        except OSError:
            pass
        finally:
            sock.close()
    return out


def test_a_store_clients_connection_gets_the_deadline_and_other_connections_do_not():
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=datetime.timedelta(seconds=5))
    other = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(other.getsockname())
    try:
        client.set("k", "v")
        assert _user_timeouts(server.port) and set(_user_timeouts(server.port)) == {0}  # torch sets none
        assert bound_store_connections(server.port, 7.5) >= 1
        assert set(_user_timeouts(server.port)) == {7500}
        assert _user_timeouts(other.getsockname()[1]) == [0]  # a connection to another port is left alone
        assert client.get("k") == b"v"  # the store still works
        assert bound_store_connections(None, 7.5) == bound_store_connections("", 7.5) == 0
    finally:
        peer.close()
        other.close()
        del client, server
