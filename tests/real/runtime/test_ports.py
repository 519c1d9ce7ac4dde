"""``gyre.real.runtime.ports.free_port``: ports outside the kernel's ephemeral range, never twice in a row.

What failed before: the proxy's port came from ``bind(0)``, Mooncake's transfer engine was handed
the same ephemeral port between the choice and the proxy's bind, and the proxy died with
``EADDRINUSE``.
"""

from __future__ import annotations

import socket

import pytest

from gyre.real.runtime.ports import PORT_FLOOR, ephemeral_low, free_port


def test_a_port_lies_below_the_ephemeral_range_and_binds():
    port = free_port()
    assert PORT_FLOOR <= port < ephemeral_low()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_ports_asked_for_before_any_is_bound_all_differ():
    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == len(ports)


def test_a_bound_port_is_never_handed_out():
    held = []
    try:
        for _ in range(30):
            sock = socket.socket()
            sock.bind(("127.0.0.1", free_port()))  # raises EADDRINUSE if a held port came back
            held.append(sock)
    finally:
        for sock in held:
            sock.close()


def test_the_kernel_picks_the_ephemeral_choice_where_no_room_is_left_below_it():
    port = free_port(low=PORT_FLOOR + 10)
    assert port >= ephemeral_low() or port < PORT_FLOOR


@pytest.mark.parametrize("text, low", [("1024\t65535\n", 1024), ("", 32768), ("garbage", 32768)])
def test_the_ephemeral_range_is_read_or_defaulted(tmp_path, text, low):
    path = tmp_path / "range"
    path.write_text(text)
    assert ephemeral_low(path) == low
    assert ephemeral_low(tmp_path / "missing") == 32768
