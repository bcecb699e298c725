"""The control loop's client and collector against runtimes answering /v1/windows in the binary
encoding (moe_contract.windows_wire): it asks for it, still reads a JSON-only runtime, and a
truncated, oversized, lying or garbage binary answer is a failure in status (or dropped windows),
never an exception out of `collect`."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from moe_contract import windows_wire as ww
from moe_contract.windows_wire import WireWindow
from moe_operator.control import client as client_module
from moe_operator.control.client import RuntimeAnswerError, RuntimeClient
from moe_operator.control.windows import History, parse_windows
from moe_operator.handlers import control_loop

SHAPE = (2, 3)
JSON = "application/json; charset=utf-8"
Answer = Callable[[str | None, int], tuple[str, bytes]]  # (Accept, after) -> (Content-Type, body)


def windows(latest: int = 3) -> list[WireWindow]:
    counts = np.arange(6).reshape(SHAPE) * 2**22
    return [WireWindow(s, 1.0, 2.0 + s, 10, counts + s, counts[None] // 4 if s == latest else None)
            for s in range(1, latest + 1)]  # fmt: skip


def json_body(ws: list[WireWindow], latest: int) -> bytes:
    docs = [{"seq": w.seq, "started_at": w.started_at, "ended_at": w.ended_at, "passes": w.passes,
             "counts": w.counts.tolist(), **({"steps": w.steps.tolist()} if w.steps is not None else {})}
            for w in ws]  # fmt: skip
    return json.dumps({"windows": docs, "latest_seq": latest, "now": 10.0}).encode()


def modern(latest: int = 3) -> Answer:
    """A runtime of this version: binary to who asks, JSON to anyone else."""

    def answer(accept: str | None, after: int) -> tuple[str, bytes]:
        ws = [w for w in windows(latest) if w.seq > after]
        if ww.accepts(accept):
            return ww.MEDIA_TYPE, ww.encode(ws, latest, 10.0)
        return JSON, json_body(ws, latest)

    return answer


def older(accept: str | None, after: int) -> tuple[str, bytes]:
    """A runtime from before the encoding: JSON whatever is asked."""
    return JSON, json_body([w for w in windows() if w.seq > after], 3)


def fixed(content_type: str, body: bytes) -> Answer:
    return lambda accept, after: (content_type, body)


@dataclass
class Peer:
    answer: Answer
    accepts: list[str | None] = field(default_factory=list)


def serve(peer: Peer, host: str, port: int) -> ThreadingHTTPServer:
    class Runtime(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            peer.accepts.append(self.headers.get("Accept"))
            after = int(parse_qs(urlparse(self.path).query).get("after", ["0"])[0])
            content_type, body = peer.answer(self.headers.get("Accept"), after)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Runtime)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


@pytest.fixture()
def runtimes() -> Iterator[Callable[[list[Answer]], tuple[list[Peer], int]]]:
    """Runtimes on one port, one per loopback address (127.0.0.2, .3, ...), as leaders on pod IPs."""
    servers: list[ThreadingHTTPServer] = []

    def start(answers: list[Answer]) -> tuple[list[Peer], int]:
        peers = [Peer(a) for a in answers]
        port = 0
        for i, peer in enumerate(peers):
            servers.append(serve(peer, f"127.0.0.{i + 2}", port))
            port = servers[0].server_address[1]
        return peers, port

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_the_operator_asks_for_binary_and_reads_the_same_windows_as_from_json(runtimes: Any) -> None:
    (new, old), port = runtimes([modern(), older])
    with RuntimeClient(port=port) as client:
        binary, plain = client.windows("127.0.0.2", 1), client.windows("127.0.0.3", 1)
    assert new.accepts == old.accepts == [ww.ACCEPT]
    assert isinstance(binary["windows"][0]["counts"], np.ndarray)  # it was the binary answer
    assert isinstance(plain["windows"][0]["counts"], list)  # the older runtime's JSON, still read
    got, want = parse_windows("a", binary, SHAPE, now=10.0), parse_windows("a", plain, SHAPE, now=10.0)
    assert [w.seq for w in got] == [w.seq for w in want] == [2, 3]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.counts, w.counts)
        assert (g.steps is None) == (w.steps is None)
    assert got[-1].steps is not None and want[-1].steps is not None
    np.testing.assert_array_equal(got[-1].steps, want[-1].steps)


def good() -> bytes:
    return ww.encode(windows(), 3, 10.0)


HOSTILE: dict[str, bytes] = {
    "truncated header": good()[:20],
    "truncated array": good()[:-1],
    "trailing bytes": good() + b"\x00",
    "garbage": b"\x89PNG\r\n\x1a\n" + b"\x00" * 64,
    "json under the binary type": json_body(windows(), 3),
    "empty": b"",
    "next version": good()[:4] + (2).to_bytes(2, "little") + good()[6:],
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_a_broken_binary_answer_is_a_refusal(runtimes: Any, what: str) -> None:
    _, port = runtimes([fixed(ww.MEDIA_TYPE, HOSTILE[what])])
    with RuntimeClient(port=port) as client, pytest.raises(RuntimeAnswerError, match="binary answer refused"):
        client.windows("127.0.0.2", 0)


def test_an_oversized_binary_answer_is_cut_at_the_cap(runtimes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "MAX_ANSWER_BYTES", 1024)
    big = [WireWindow(1, 1.0, 2.0, 1, np.ones((64, 256), dtype=np.int64))]
    _, port = runtimes([fixed(ww.MEDIA_TYPE, ww.encode(big, 1, 10.0))])
    with RuntimeClient(port=port) as client, pytest.raises(RuntimeAnswerError, match="larger than 1024"):
        client.windows("127.0.0.2", 0)


def lying_header(**fields: Any) -> bytes:
    """A whole answer (sizes right) whose header says what a hostile runtime wants."""
    body = ww.encode(windows(1), 1, 10.0)
    (n,) = np.frombuffer(body, dtype="<u4", count=1, offset=6)
    header = {**json.loads(body[10 : 10 + n]), **fields}
    text = json.dumps(header).encode()
    return ww.PREFIX.pack(ww.MAGIC, ww.VERSION, len(text)) + text + body[10 + n :]


def test_collect_survives_every_hostile_leader_and_keeps_the_good_ones(runtimes: Any) -> None:
    nan = [WireWindow(1, 1.0, 2.0, 1, np.full(SHAPE, np.nan))]
    other_shape = [WireWindow(1, 1.0, 2.0, 1, np.ones((3, 2), dtype=np.int64))]
    answers: list[Answer] = [
        modern(),
        older,
        *(fixed(ww.MEDIA_TYPE, body) for body in HOSTILE.values()),
        fixed(ww.MEDIA_TYPE, lying_header(latest_seq="x")),  # int("x"): ValueError
        fixed(ww.MEDIA_TYPE, lying_header(latest_seq=1e400)),  # inf: OverflowError
        fixed(ww.MEDIA_TYPE, lying_header(latest_seq=[1])),  # TypeError
        fixed(ww.MEDIA_TYPE, ww.encode(nan, 1, 10.0)),  # read, and its window dropped
        fixed(ww.MEDIA_TYPE, ww.encode(other_shape, 1, 10.0)),
    ]
    peers, port = runtimes(answers)
    leaders = [{"name": f"p{i}", "uid": "u", "ip": f"127.0.0.{i + 2}"} for i in range(len(peers))]
    history = History()
    tick: Any = SimpleNamespace(state=SimpleNamespace(history=history),
                                shape=SimpleNamespace(num_layers=SHAPE[0], num_experts=SHAPE[1]))  # fmt: skip
    with RuntimeClient(port=port) as client:
        failed, added = control_loop.collect(tick, client, leaders)
    assert added == 6  # three windows from each good runtime
    assert {w.instance for w in history.windows} == {"p0/u", "p1/u"}
    assert {f.split(":")[0] for f in failed} == {f"p{i}" for i in range(2, 12)}
    assert all(len(f) <= 120 for f in failed)


def test_a_restarted_runtime_is_read_from_the_start_in_binary_too(runtimes: Any) -> None:
    (peer,), port = runtimes([modern(latest=2)])
    history = History()
    history.cursors["p0/u"] = 50  # what the operator held before the runtime restarted
    tick: Any = SimpleNamespace(state=SimpleNamespace(history=history),
                                shape=SimpleNamespace(num_layers=SHAPE[0], num_experts=SHAPE[1]))  # fmt: skip
    with RuntimeClient(port=port) as client:
        failed, added = control_loop.collect(tick, client, [{"name": "p0", "uid": "u", "ip": "127.0.0.2"}])
    assert (failed, added, history.cursors["p0/u"]) == ([], 2, 2)
    assert peer.accepts == [ww.ACCEPT, ww.ACCEPT]
