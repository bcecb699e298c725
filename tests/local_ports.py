"""Loopback ports for test servers, picked where nothing else takes them by itself.

``bind(0)`` hands out ports from the kernel's ephemeral range, the same range every outgoing
connection of the sandbox (kubelets of kwok, the operator, httpx clients) takes its source port
from. A port picked that way and let go can be taken by such a connection before the server
under test binds it, and the server then fails or, worse, a fake keeps running without
listening. Ports outside the ephemeral range (below it, or above it where it starts low) are never
handed out as source ports, so only another explicit listener can take one. The sandbox's fixed bases (16000+, 17000+, 19000+) lie below
``LOW``. A process never hands out the same port twice.
"""

from __future__ import annotations

import os
import random
import socket
import warnings
from pathlib import Path

LOW = 20768  # above the sandbox's fixed port bases
_FALLBACK_EPHEMERAL_LOW = 32768  # Linux's default when /proc says nothing
_given: set[int] = set()
_rng = random.Random(os.getpid())  # two processes picking at once start at different places


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral (source-port) range, both ends included."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
    except (OSError, ValueError):
        return _FALLBACK_EPHEMERAL_LOW, 60999
    return low, high


def _outside_ephemeral() -> range:
    """Ports no outgoing connection takes: below the range (above LOW), else above it."""
    low, high = ephemeral_range()
    if low - LOW >= 1000:
        return range(LOW, low)
    if 65535 - high >= 1000:
        return range(high + 1, 65536)
    return range(0)


def _free(port: int) -> bool:
    """Nothing listens on or holds ``port`` on loopback (checked without SO_REUSEADDR, so a
    socket lingering in TIME_WAIT counts as taken too)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """One loopback port below the ephemeral range, free now, never given before in this process."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports below the ephemeral range, each free when picked."""
    ports = _outside_ephemeral()
    if not ports:  # the ephemeral range covers nearly everything: the kernel's choice it is
        warnings.warn(
            "no ports outside the ephemeral range: test ports may race outgoing connections", stacklevel=2
        )
        return _kernel_ports(count)
    out: list[int] = []
    candidates = list(ports)
    _rng.shuffle(candidates)
    for port in candidates:
        if port not in _given and _free(port):
            _given.add(port)
            out.append(port)
            if len(out) == count:
                return out
    raise RuntimeError(f"no {count} free loopback ports in {ports.start}-{ports.stop - 1}")


def _kernel_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
