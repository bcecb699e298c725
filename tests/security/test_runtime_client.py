"""The control loop's client against a hostile runtime answering placement pushes: an endless
body (after 200 or a refusal), a trickled refusal, and status codes of its own choosing. The
operator must read no more than a refusal's first bytes, return within its deadline, and count
only known statuses by name."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from moe_operator.control.client import MAX_REFUSAL_BYTES, Pushed, RuntimeClient

ENDLESS = 512 * 2**20  # more than any socket buffer: a client that reads it all takes it all
CHUNK = b"x" * 65536


@dataclass
class Peer:
    """What the hostile runtime answers next, and how many body bytes it got out."""

    status: int = 200
    trickle_s: float = 0.0  # > 0: one byte per this many seconds, forever
    sent: int = 0
    done: threading.Event = field(default_factory=threading.Event)


def handler(peer: Peer) -> type[BaseHTTPRequestHandler]:
    class Hostile(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(peer.status)
            self.send_header("Content-Length", str(ENDLESS))
            self.end_headers()
            try:
                while peer.sent < ENDLESS:
                    if peer.trickle_s:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        peer.sent += 1
                        peer.done.wait(peer.trickle_s)
                        if peer.done.is_set():
                            return
                    else:
                        self.wfile.write(CHUNK)
                        peer.sent += len(CHUNK)
            except OSError:
                pass  # the client hung up, as it should

        def log_message(self, *args: object) -> None:
            pass

    return Hostile


@pytest.fixture()
def peer() -> Iterator[tuple[Peer, int]]:
    state = Peer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, server.server_address[1]
    finally:
        state.done.set()
        server.shutdown()
        server.server_close()


def push(port: int, timeout_s: float = 3.0) -> Pushed:
    """One push, run on a thread so that a client that never returns fails the test, not hangs it."""
    out: list[Pushed] = []
    with RuntimeClient(timeout_s=timeout_s, port=port) as client:
        worker = threading.Thread(target=lambda: out.append(client.push("127.0.0.1", {"version": 1})))
        worker.start()
        worker.join(60)
    assert out, "push did not return"
    return out[0]


@pytest.mark.parametrize("status", [200, 500])
def test_an_endless_answer_is_not_read(peer: tuple[Peer, int], status: int) -> None:
    state, port = peer
    state.status = status
    got = push(port)
    assert got.result == ("ok" if status == 200 else "http_500")
    if status != 200:
        assert got.refusal is not None and got.refusal.startswith("HTTP 500 xxx")
        assert len(got.refusal) <= len("HTTP 500 ") + 120
    # what left the peer before the client hung up: the refusal's bytes plus socket buffers
    assert state.sent < ENDLESS // 8, f"the client read {state.sent} bytes of an endless answer"
    assert MAX_REFUSAL_BYTES < ENDLESS // 8


def test_a_trickled_refusal_ends_at_the_deadline(peer: tuple[Peer, int]) -> None:
    state, port = peer
    state.status, state.trickle_s = 422, 0.05  # each byte well inside the read timeout
    got = push(port, timeout_s=0.5)
    assert got.result == "http_422"
    assert got.refusal is not None and got.refusal.startswith("HTTP 422 x")
    assert state.sent < MAX_REFUSAL_BYTES  # it stopped at the deadline, not at the byte cap


@pytest.mark.parametrize(("status", "result"), [(401, "http_401"), (409, "http_409"), (299, "http_other"), (599, "http_other"), (999, "http_other")])  # fmt: skip
def test_statuses_outside_the_sidecars_are_counted_as_other(
    peer: tuple[Peer, int], status: int, result: str
) -> None:
    state, port = peer
    state.status = status
    assert push(port).result == result
