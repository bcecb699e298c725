"""/v1/windows on the wire, JSON vs the binary encoding (moe_contract.windows_wire), at DeepSeek-V3
shape: 58 MoE layers x 256 experts, the newest window with 32 step samples, answers of 1 and 8
windows (one poll of a leader that is up to date, and one after a few missed refreshes).

Both answers are built by the runtime's own code (moe_runtime.sidecar.state.Window.to_json, as
the route serializes it, and Window.to_wire + windows_wire.encode) and read by the operator's
(json.loads + parse_windows, and windows_wire.decode + parse_windows), so the windows compared are
the ones the control loop would keep; the run checks they are equal. Printed per answer: bytes,
the operator's decode CPU (median of --reps runs, process time) and the runtime's encode CPU, with
JSON / binary ratios. Counts are skewed like routed traffic: a window's sums average 200k tokens
per expert (a few past 2^24), a pass's about 200. Usage:

    .venv/bin/python benchmarks/windows_wire.py [--reps 15] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from moe_contract import windows_wire
from moe_operator.control.windows import Window, parse_windows
from moe_runtime import exchange
from moe_runtime.sidecar.state import Window as RuntimeWindow

SHAPE = (58, 256)
STEPS = 32
NOW = 1_800_000_000.0


def ring(count: int, rng: np.random.Generator) -> list[RuntimeWindow]:
    """The runtime's newest ``count`` windows, as its ring holds them (steps on the newest only)."""
    out = []
    for i in range(count):
        counts = rng.gamma(0.8, 250_000, SHAPE).astype(np.int64)
        counts[i % SHAPE[0], 0] = 2**24 + 17  # a hot expert past float32's exact integers
        steps = rng.gamma(0.8, 250, (STEPS, *SHAPE)).astype(np.int32) if i == count - 1 else None
        ended = NOW - 60.0 * (count - 1 - i)
        record = exchange.WindowRecord(counts, 7000, ended - 60.0, ended, {}, steps)
        out.append(RuntimeWindow(100 + i, record, "operator", 3))
    return out


def json_answer(items: list[RuntimeWindow]) -> bytes:
    """What GET /v1/windows?counts=true&steps=true answers without the Accept header (app.windows)."""
    doc = {
        "windows": [w.to_json(8, counts=True, steps=True) for w in items],
        "latest_seq": items[-1].seq,
        "now": NOW,
    }
    return json.dumps(doc).encode()


def binary_answer(items: list[RuntimeWindow]) -> bytes:
    """What it answers to the operator's Accept header."""
    return windows_wire.encode([w.to_wire(steps=True) for w in items], items[-1].seq, NOW)


def cpu_ms(fn: Callable[[], Any], reps: int) -> float:
    """Median process time of one call, in ms (one warm-up call first)."""
    fn()
    times = []
    for _ in range(reps):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return 1000 * statistics.median(times)


def same(a: list[Window], b: list[Window]) -> bool:
    return len(a) == len(b) and all(
        x.seq == y.seq
        and x.ended_at == y.ended_at
        and np.array_equal(x.counts, y.counts)
        and (x.steps is None) == (y.steps is None)
        and (x.steps is None or y.steps is None or np.array_equal(x.steps, y.steps))
        for x, y in zip(a, b, strict=True)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"/v1/windows at {SHAPE[0]}x{SHAPE[1]}, {STEPS} step samples on the newest window; "
          f"CPU: median of {args.reps} (ms)")  # fmt: skip
    head = ("windows", "JSON bytes", "binary bytes", "ratio", "decode JSON", "decode binary", "ratio",
            "encode JSON", "encode binary", "ratio")  # fmt: skip
    print("{:>7} {:>12} {:>12} {:>6} {:>11} {:>13} {:>6} {:>11} {:>13} {:>6}".format(*head))
    for count in (1, 8):
        items = ring(count, rng)
        plain, binary = json_answer(items), binary_answer(items)

        def read_json(body: bytes = plain) -> list[Window]:
            return parse_windows("i", json.loads(body), SHAPE, now=NOW)

        def read_binary(body: bytes = binary) -> list[Window]:
            return parse_windows("i", windows_wire.decode(body), SHAPE, now=NOW)

        if not same(read_json(), read_binary()) or len(read_binary()) != count:
            raise SystemExit("the binary answer did not read as its JSON twin")
        dec_j, dec_b = cpu_ms(read_json, args.reps), cpu_ms(read_binary, args.reps)
        enc_j = cpu_ms(lambda items=items: json_answer(items), args.reps)
        enc_b = cpu_ms(lambda items=items: binary_answer(items), args.reps)
        print(f"{count:>7} {len(plain):>12,} {len(binary):>12,} {len(plain) / len(binary):>5.1f}x "
              f"{dec_j:>11.1f} {dec_b:>13.2f} {dec_j / dec_b:>5.1f}x "
              f"{enc_j:>11.1f} {enc_b:>13.2f} {enc_j / enc_b:>5.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
