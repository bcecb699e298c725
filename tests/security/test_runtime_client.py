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


class _Raw(threading.Thread):
    """A runtime that answers every request with the bytes ``answer`` gives, paced as it likes."""

    def __init__(self, answer: object) -> None:
        super().__init__(daemon=True)
        import socket

        self.answer = answer
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: object) -> None:
        import contextlib

        with contextlib.suppress(OSError):
            conn.recv(65536)  # type: ignore[attr-defined]
            self.answer(conn, self.stop)  # type: ignore[operator]
        with contextlib.suppress(OSError):
            conn.close()  # type: ignore[attr-defined]


def _resident_mb() -> float:
    from pathlib import Path

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_compressed_answer_is_refused_not_inflated() -> None:
    """1.8 kB of gzip(gzip(1 GiB of zeros)) inflated before any byte cap counted it (2 GiB resident)."""
    import gzip
    import time

    from moe_operator.control.client import RuntimeAnswerError

    inner = gzip.compress(b"\0" * 2**27, compresslevel=9)  # 128 MiB of zeros, twice gzipped
    bomb = gzip.compress(inner, compresslevel=9)

    def answer(conn: object, _: threading.Event) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip, gzip\r\nContent-Length: {len(bomb)}\r\n\r\n"
        conn.sendall(head.encode() + bomb)  # type: ignore[attr-defined]

    srv = _Raw(answer)
    srv.start()
    before = _resident_mb()
    started = time.monotonic()
    with RuntimeClient(tokens={"127.0.0.1": "t"}, port=srv.port) as client:
        for call in (lambda: client.proposal("127.0.0.1", "r"), lambda: client.windows("127.0.0.1", 0)):
            with pytest.raises(RuntimeAnswerError):
                call()
        assert client.push("127.0.0.1", {"version": 1}).result == "unreachable"
    srv.stop.set()
    assert _resident_mb() - before < 64
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("mode", ["header bytes", "100 continue"])
def test_a_runtime_trickling_its_headers_is_cut_at_the_deadline(mode: str) -> None:
    """httpx's timeouts are per socket read: without a deadline over the whole exchange, a header
    byte every 0.5 s would hold the loop for hours (h11 allows 16 kB of headers)."""
    import time

    from moe_operator.control.client import RuntimeAnswerError
    from moe_operator.handlers.runtime_planning import gather_proposals

    def answer(conn: object, stop: threading.Event) -> None:
        if mode == "header bytes":
            conn.sendall(b"HTTP/1.1 200 OK\r\n")  # type: ignore[attr-defined]
        while not stop.wait(0.5):
            piece = b"X: a\r\n" if mode == "header bytes" else b"HTTP/1.1 100 Continue\r\n\r\n"
            conn.sendall(piece)  # type: ignore[attr-defined]

    srv = _Raw(answer)
    srv.start()
    try:
        with RuntimeClient(tokens={"127.0.0.1": "t"}, timeout_s=1.0, port=srv.port) as client:
            started = time.monotonic()
            with pytest.raises(RuntimeAnswerError):
                client.proposal("127.0.0.1", "r")
            assert time.monotonic() - started < 4 * 1.0 + 2
            started = time.monotonic()
            assert client.push("127.0.0.1", {"version": 1}).result == "unreachable"
            assert time.monotonic() - started < 4 * 1.0 + 2
            started = time.monotonic()
            proposals, missing = gather_proposals(
                client, [{"name": "a-0", "ip": "127.0.0.1"}], {"a-0": _request()}, 2.0
            )
            assert proposals == {} and "a-0" in missing
            assert time.monotonic() - started < 2 * (4 * 1.0 + 2) + 2.0 + 2
    finally:
        srv.stop.set()


def _request() -> object:
    import numpy as np

    from moe_contract.plan_wire import PlanRequest
    from moe_placement.maps import trivial_map

    return PlanRequest(
        "r", 10.0, (0,), 0.0, 2, 1, 0, 1, "static", None, np.zeros((1, 2, 4)), trivial_map(2, 4, 4)
    )
