"""The plan request a runtime gets (moe_contract.plan_wire): exact round trips, and a decoder that
refuses anything but one whole, consistent request before the runtime plans on it, without
allocating what a header claims."""

from __future__ import annotations

import json
import struct
import tracemalloc
from typing import Any

import numpy as np
import pytest

from moe_contract import plan_wire as pw
from moe_contract.plan_wire import MAGIC, PREFIX, VERSION, PlanRequest
from moe_contract.windows_wire import WireError


def request(**kw: Any) -> PlanRequest:
    """Three buckets of [2 layers, 4 experts], 2 redundant slots on 3 GPUs."""
    rng = np.random.default_rng(1)
    base: dict[str, Any] = {
        "request": "pool-a.i-0:17", "bucket_s": 300.0, "keys": (5, 6, 9), "fresh_after": 1.7e9,
        "num_gpus": 3, "num_nodes": 1, "num_redundant": 2, "num_groups": 1, "dispatch": "static",
        "max_moves": 4, "prior": rng.random((3, 2, 4)) * 1e6,
        "current": np.array([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 3]]),
    }  # fmt: skip
    return PlanRequest(**{**base, **kw})


def header_of(r: PlanRequest) -> dict[str, Any]:
    body = pw.encode(r)
    _, _, n = PREFIX.unpack_from(body)
    doc: dict[str, Any] = json.loads(body[PREFIX.size : PREFIX.size + n])
    return doc


def forge(r: PlanRequest | None = None, *, payload: bytes | None = None, magic: bytes = MAGIC,
          version: int = VERSION, header_len: int | None = None, **header: Any) -> bytes:  # fmt: skip
    """A request built by hand from a good one: whatever a hostile peer cares to send."""
    r = r or request()
    h = {**header_of(r), **header}
    text = json.dumps(h).encode()
    if payload is None:
        payload = np.asarray(r.prior, "<f8").tobytes() + np.asarray(r.current, "<u2").tobytes()
    return PREFIX.pack(magic, version, len(text) if header_len is None else header_len) + text + payload


def refused(body: bytes, words: str) -> None:
    with pytest.raises(WireError, match=words):
        pw.decode(body)


def test_a_request_round_trips_exactly() -> None:
    want = request()
    got = pw.decode(pw.encode(want))
    for name in ("request", "bucket_s", "keys", "fresh_after", "num_gpus", "num_nodes", "num_redundant",
                 "num_groups", "dispatch", "max_moves"):  # fmt: skip
        assert getattr(got, name) == getattr(want, name), name
    assert got.prior.dtype == np.float64 and got.current.dtype == np.int64
    np.testing.assert_array_equal(got.prior, want.prior)  # float64 bit for bit
    np.testing.assert_array_equal(got.current, want.current)
    assert got.prior.flags.writeable and got.current.flags.writeable  # copies, not views of the body
    assert pw.decode(bytearray(pw.encode(want))).request == want.request
    assert pw.decode(pw.encode(request(max_moves=None, dispatch="dynamic"))).max_moves is None


def test_every_truncation_is_refused() -> None:
    body = pw.encode(request())
    for n in range(len(body)):
        with pytest.raises(WireError):
            pw.decode(body[:n])


@pytest.mark.parametrize(
    ("cut", "words"),
    [("prefix", "shorter than"), ("header", "a header of"), ("prior", "runs past"), ("current", "runs past")],
)
def test_a_cut_at_each_boundary_says_where(cut: str, words: str) -> None:
    r = request()
    body = pw.encode(r)
    _, _, n = PREFIX.unpack_from(body)
    ends = {
        "prefix": PREFIX.size - 1,
        "header": PREFIX.size + n - 1,
        "prior": PREFIX.size + n + r.prior.size * 8 - 1,
        "current": len(body) - 1,
    }
    refused(body[: ends[cut]], words)


def test_trailing_bytes_are_refused() -> None:
    refused(pw.encode(request()) + b"\0", "past the last array")


def test_a_body_past_the_cap_is_refused_before_it_is_parsed() -> None:
    refused(b"\0" * (pw.MAX_REQUEST_BYTES + 1), "at most")


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"magic": b"MOEW"}, "not a plan request"),
        ({"version": VERSION + 1}, "not a plan request"),
        ({"header_len": 2**32 - 1}, "a header of"),
        ({"header_len": pw.MAX_HEADER_BYTES + 1}, "a header of"),
    ],
)
def test_wrong_prefixes_are_refused(kw: dict[str, Any], words: str) -> None:
    refused(forge(**kw), words)


def test_a_header_that_is_not_a_json_object_is_refused() -> None:
    for text, words in (
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not an object"),
        (b"[" * 60_000, "not JSON"),
    ):
        refused(PREFIX.pack(MAGIC, VERSION, len(text)) + text, words)


def test_huge_claimed_sizes_allocate_nothing() -> None:
    body = forge(shape=[65536, 65534], slots=65536, num_gpus=2, keys=list(range(64)))
    tracemalloc.start()
    try:
        refused(body, "runs past")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the claim was 2 TB of prior
    refused(forge(shape=[65537, 4]), "shape")


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ({"keys": [5, 5, 9]}, "not increasing"),
        ({"keys": [9, 6, 5]}, "not increasing"),
        ({"keys": []}, "bucket numbers"),
        ({"keys": list(range(pw.MAX_BUCKETS + 1))}, "bucket numbers"),
        ({"keys": [5, -1, 9]}, "bucket numbers"),
        ({"keys": [5, 6.0, 9]}, "bucket numbers"),
        ({"keys": [5, True, 9]}, "bucket numbers"),
        ({"keys": "5,6,9"}, "bucket numbers"),
        ({"slots": 7}, "experts \\+ redundant"),  # 4 experts + 2 redundant are 6
        ({"num_redundant": 3}, "experts \\+ redundant"),
        ({"num_gpus": 4}, "evenly"),  # 6 slots over 4 GPUs
        ({"slots": 3}, "at least the experts"),
        ({"num_gpus": 0}, "counts"),
        ({"num_nodes": 0}, "counts"),
        ({"num_groups": 0}, "evenly"),
        ({"num_gpus": True}, "counts"),
        ({"num_redundant": 2.0}, "counts"),
        ({"num_groups": None}, "counts"),
        ({"max_moves": True}, "max_moves"),
        ({"max_moves": -1}, "max_moves"),
        ({"max_moves": 1.5}, "max_moves"),
        ({"bucket_s": True}, "bucket_s"),
        ({"bucket_s": 0}, "bucket_s"),
        ({"bucket_s": 86401}, "bucket_s"),
        ({"bucket_s": "300"}, "bucket_s"),
        ({"fresh_after": None}, "fresh_after"),
        ({"fresh_after": False}, "fresh_after"),
        ({"shape": [2, True]}, "shape"),
        ({"shape": [2, 0]}, "shape"),
        ({"shape": [2, 4, 1]}, "shape"),
        ({"dispatch": "random"}, "dispatch"),
        ({"dispatch": None}, "dispatch"),
    ],
)
def test_header_fields_are_checked_for_type_and_range(header: dict[str, Any], words: str) -> None:
    refused(forge(**header), words)


@pytest.mark.parametrize("name", ["", "a b", "x" * 129, "é", "a/b\n", 17, None, True, ["a"]])
def test_bad_request_ids_are_refused(name: Any) -> None:
    refused(forge(request=name), "request is not an id")


def test_the_longest_and_oddest_allowed_ids_pass() -> None:
    for name in ("x" * 128, "a.b_c:d-e", "0"):
        assert pw.decode(pw.encode(request(request=name))).request == name


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -1e-9])
def test_a_prior_that_is_not_finite_and_non_negative_is_refused(bad: float) -> None:
    prior = request().prior.copy()
    prior[1, 0, 2] = bad
    refused(pw.encode(request(prior=prior)), "prior")


def test_map_entries_outside_the_experts_are_refused() -> None:
    current = request().current.copy()
    current[1, 5] = 4  # 4 experts: 0-3
    refused(pw.encode(request(current=current)), "outside")
    r = request()
    payload = np.asarray(r.prior, "<f8").tobytes() + struct.pack("<12H", *([0] * 11 + [65535]))
    refused(forge(payload=payload), "outside")
