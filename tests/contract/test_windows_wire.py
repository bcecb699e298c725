"""The binary encoding of /v1/windows answers (moe_contract.windows_wire): exact round trips, the
dtypes the encoder picks, its bounds, the media-type negotiation, and a decoder that refuses
anything but one whole answer without allocating what a header claims."""

from __future__ import annotations

import json
import struct
import tracemalloc
from typing import Any

import numpy as np
import pytest

from moe_contract import windows_wire as ww
from moe_contract.windows_wire import MAGIC, PREFIX, VERSION, WireError, WireWindow


def answer(k: int = 3) -> tuple[list[WireWindow], bytes]:
    """Two windows of [2, 3], the newest with k step samples."""
    rng = np.random.default_rng(7)
    windows = [
        WireWindow(4, 10.0, 20.0, 100, rng.integers(0, 2**20, (2, 3))),
        WireWindow(5, 20.0, 30.0, 100, rng.integers(0, 2**20, (2, 3)), rng.integers(0, 900, (k, 2, 3))),
    ]
    return windows, ww.encode(windows, 5, 31.0)


def raw(header: Any, payload: bytes = b"", *, magic: bytes = MAGIC, version: int = VERSION,
        header_len: int | None = None) -> bytes:  # fmt: skip
    """An answer built by hand: whatever a hostile peer cares to send."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return PREFIX.pack(magic, version, len(text) if header_len is None else header_len) + text + payload


def entry(**kw: Any) -> dict[str, Any]:
    base = {"seq": 1, "started_at": 0.0, "ended_at": 1.0, "passes": 1, "shape": [2, 3], "counts": "u4",
            "steps": 0, "steps_dtype": None}  # fmt: skip
    return {**base, **kw}


def test_round_trip_is_exact_and_keeps_the_cursor_fields() -> None:
    windows, body = answer()
    got = ww.decode(body)
    assert (got["latest_seq"], got["now"]) == (5, 31.0)
    assert [w["seq"] for w in got["windows"]] == [4, 5]
    for sent, back in zip(windows, got["windows"], strict=True):
        assert (back["started_at"], back["ended_at"], back["passes"]) == (sent.started_at, sent.ended_at, 100)
        np.testing.assert_array_equal(back["counts"], sent.counts)
        assert not back["counts"].flags.writeable  # views of the body: the reader copies what it keeps
    assert "steps" not in got["windows"][0]
    np.testing.assert_array_equal(got["windows"][1]["steps"], windows[1].steps)


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        (np.array([[0, 65535]]), "u2"),
        (np.array([[0, 65536]]), "u4"),
        (np.array([[1, 2**32 - 1]], dtype=np.uint32), "u4"),
        (np.array([[1, 2**32]]), "u8"),  # a window's sum past uint32
        (np.array([[1, 2**64 - 1]], dtype=np.uint64), "u8"),
        (np.array([[16777217, 3]], dtype=np.int64), "u4"),  # past float32's exact integers
        (np.array([[-1, 3]]), "f8"),  # not a count: sent as it is, the reader drops it
        (np.array([[0.5, 3.0]]), "f8"),
        (np.array([[np.nan, np.inf]]), "f8"),
        (np.zeros((0, 3), dtype=np.int64), "u2"),
    ],
)
def test_each_array_goes_in_the_narrowest_dtype_that_holds_it_exactly(values: Any, dtype: str) -> None:
    assert ww.wire_dtype(values) == dtype
    steps = values[None] if values.size else None
    body = ww.encode([WireWindow(1, 0.0, 1.0, 1, values, steps)], 1, 2.0)
    (w,) = ww.decode(body)["windows"]
    assert w["counts"].dtype.str[1:] == dtype and w["counts"].shape == values.shape
    np.testing.assert_array_equal(w["counts"], values)  # NaN == NaN here: equal_nan for arrays
    if steps is not None:
        np.testing.assert_array_equal(w["steps"], steps)


def test_step_samples_of_another_shape_and_unasked_counts_are_left_out() -> None:
    counts = np.ones((2, 3), dtype=np.int64)
    body = ww.encode([WireWindow(1, 0.0, 1.0, 1, counts, np.ones((4, 3, 2), dtype=np.int32))], 1, 2.0)
    assert "steps" not in ww.decode(body)["windows"][0]
    bare = ww.encode([WireWindow(1, 0.0, 1.0, 1, counts, np.ones((4, 2, 3)))], 1, 2.0, with_counts=False)
    (w,) = ww.decode(bare)["windows"]
    assert "counts" not in w and w["steps"].shape == (4, 2, 3)


def test_an_answer_stays_within_its_bounds_and_the_rest_waits_for_the_next_poll() -> None:
    counts = np.full((4, 256), 2**20, dtype=np.int64)  # 4 kB as uint32
    many = [WireWindow(s, 0.0, float(s), 1, counts) for s in range(1, 11)]
    body = ww.encode(many, 10, 11.0, max_bytes=5 * 4096 + 2000)
    assert len(body) <= 5 * 4096 + 2000
    got = ww.decode(body)
    assert [w["seq"] for w in got["windows"]] == [1, 2, 3, 4, 5] and got["latest_seq"] == 10  # oldest first
    one = ww.decode(ww.encode(many, 10, 11.0, max_bytes=10))["windows"]
    assert [w["seq"] for w in one] == [1]  # the cursor always moves
    tiny = [WireWindow(s, 0.0, float(s), 1, np.zeros((1, 1), dtype=np.int64)) for s in range(2000)]
    assert len(ww.decode(ww.encode(tiny, 2000, 1.0))["windows"]) == ww.MAX_WINDOWS


def test_v3_answers_fit_far_inside_the_header_bound() -> None:
    counts = np.full((61, 256), 2**31, dtype=np.int64)
    worst = [WireWindow(2**53, 1e300, -1e300, 2**62, counts) for _ in range(ww.MAX_WINDOWS)]
    body = ww.encode(worst, 2**53, 1e300, max_bytes=2**40)
    (header_len,) = struct.unpack_from("<I", body, 6)
    assert header_len < ww.MAX_HEADER_BYTES


def test_every_truncation_is_refused() -> None:
    _, body = answer()
    for cut in range(len(body)):
        with pytest.raises(WireError):
            ww.decode(body[:cut])


@pytest.mark.parametrize("extra", [b"\x00", b"\x00" * 8, b"MOEW"])
def test_bytes_past_the_last_array_are_refused(extra: bytes) -> None:
    _, body = answer()
    with pytest.raises(WireError, match="past the last array"):
        ww.decode(body + extra)


def lies() -> list[tuple[str, bytes]]:
    """Answers that claim what is not there, or are not this encoding at all."""
    header = {"latest_seq": 1, "now": 1.0, "windows": [entry()]}
    counts = np.ones(6, dtype="<u4").tobytes()
    return [
        ("wrong magic", raw(header, counts, magic=b"MOEX")),
        ("JSON", b'{"windows": [], "latest_seq": 1}'),
        ("empty", b""),
        ("next version", raw(header, counts, version=VERSION + 1)),
        ("version 0", raw(header, counts, version=0)),
        ("header past the end", raw(header, counts, header_len=2**32 - 1)),
        ("header over its bound", raw(b" " * (ww.MAX_HEADER_BYTES + 1) + b"{}")),
        ("header not JSON", raw(b"{not json")),
        ("header not UTF-8", raw(b'{"windows": "\xff"}')),
        ("header deep", raw(b"[" * 100_000 + b"]" * 100_000)),
        ("header a list", raw([])),
        ("no windows list", raw({"windows": {"0": entry()}})),
        ("too many windows", raw({"windows": [entry(counts=None)] * (ww.MAX_WINDOWS + 1)})),
        ("entry not an object", raw({"windows": ["w"]})),
        ("no shape", raw({"windows": [entry(shape=None)]}, counts)),
        ("shape of three", raw({"windows": [entry(shape=[1, 2, 3])]}, counts)),
        ("negative shape", raw({"windows": [entry(shape=[-2, -3])]}, counts)),
        ("shape of floats", raw({"windows": [entry(shape=[2.0, 3.0])]}, counts)),
        ("shape of booleans", raw({"windows": [entry(shape=[True, True])]}, counts)),
        ("huge zero-size shape", raw({"windows": [entry(shape=[0, 10**30])]})),
        ("huge counts", raw({"windows": [entry(shape=[65536, 65536], counts="u8")]}, counts)),
        ("counts claimed larger", raw({"windows": [entry(shape=[2, 4])]}, counts)),
        ("unknown dtype", raw({"windows": [entry(counts="f4")]}, counts)),
        ("numpy dtype text", raw({"windows": [entry(counts="<u4")]}, counts)),
        ("dtype not text", raw({"windows": [entry(counts=4)]}, counts)),
        ("huge steps", raw({"windows": [entry(steps=65536, steps_dtype="u8")]}, counts)),
        ("steps past the dimension bound", raw({"windows": [entry(steps=10**9, shape=[0, 0])]})),
        ("negative steps", raw({"windows": [entry(steps=-1, steps_dtype="u2")]}, counts)),
        ("steps without dtype", raw({"windows": [entry(steps=1)]}, counts + counts)),
        ("steps not a number", raw({"windows": [entry(steps="1", steps_dtype="u4")]}, counts)),
        ("steps missing", raw({"windows": [entry(steps=1, steps_dtype="u4")]}, counts)),
        ("many huge", raw({"windows": [entry(shape=[65536, 65536], counts="f8")] * 1000}, b"\x00" * 4096)),
    ]


@pytest.mark.parametrize(("what", "body"), lies(), ids=[what for what, _ in lies()])
def test_lying_and_garbage_answers_are_refused_without_allocating_their_claims(
    what: str, body: bytes
) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(WireError):
            ww.decode(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(body) + 2**20, f"{what}: {peak} bytes"


def test_refusals_name_no_text_of_the_peer() -> None:
    body = raw({"windows": [entry(counts="<script>")]}, b"")
    with pytest.raises(WireError) as exc:
        ww.decode(body)
    assert "script" not in str(exc.value)


@pytest.mark.parametrize(
    ("accept", "binary"),
    [
        (ww.ACCEPT, True),
        (ww.MEDIA_TYPE, True),
        ("application/json, application/VND.moe-inference.windows.v1 ; q=0.9", True),
        (f"{ww.MEDIA_TYPE};q=0", False),
        (f"{ww.MEDIA_TYPE}; q=0.0", False),
        (f"{ww.MEDIA_TYPE};q=x", False),
        ("application/json", False),
        ("*/*", False),  # curl's default: JSON
        ("", False),
        (None, False),
        ("application/vnd.moe-inference.windows.v2", False),
    ],
)
def test_the_encoding_is_answered_only_to_who_asks_for_it(accept: str | None, binary: bool) -> None:
    assert ww.accepts(accept) is binary


def test_content_types() -> None:
    assert ww.is_encoded(ww.MEDIA_TYPE) and ww.is_encoded(f"{ww.MEDIA_TYPE.upper()}; charset=binary")
    assert not ww.is_encoded("application/json; charset=utf-8") and not ww.is_encoded(None)
