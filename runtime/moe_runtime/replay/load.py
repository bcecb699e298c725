"""Offered load and what it does to latency: the replay engine's requests, queue and batch.

A stand-in for SGLang's scheduler, small enough to reason about: requests arrive as a
Poisson stream at the offered rate, wait in a queue, and run in one continuously batched
engine of at most ``max_running`` requests whose KV cache fits in ``kv_tokens`` (SGLang's
max_total_num_tokens, which the instance's width sets: the weights a GPU holds leave the
rest of its memory to KV). A request is admitted when its prompt and output fit beside what
the running ones reserved; SGLang reserves the output as an estimate (max_new_tokens times
a new_token_ratio that starts at SGLANG_INIT_NEW_TOKEN_RATIO, 0.7) and retracts requests
when decode runs out, while the replay's requests know their length, so it never retracts.
``sglang:token_usage`` is the tokens held (prompts and the tokens generated so far) over
``kv_tokens``, as SGLang reports it. A request that cannot fit even alone is refused on
arrival (SGLang refuses a prompt longer than the pool). A forward pass takes
``itl_base_s + itl_per_request_s * running`` (decode gets slower as the batch grows) plus,
on standalone servers, the prefill of the requests admitted in it. Every running request
gets one token per pass. So, as on a real engine, the time to first token is queueing plus
one pass (plus the prefill, done on the prefill server in P/D), and the inter-token latency
is the pass time: both rise with offered load, slowly below the engine's capacity and
without bound above it (the queue grows). The defaults make ~8 requests/s saturate one
instance (ITL ~120 ms at 128 running), 2 requests/s run at ~25 ms ITL and ~50 ms TTFT; their
KV pool holds 128 requests of mean length, so the batch cap binds first. With long prompts,
or a narrow instance's small pool, KV binds first: requests queue while compute is idle, the
time to first token grows and token usage stays near 1, the signature of KV starvation that
a wider instance (more KV per GPU) relieves.

Observed as SGLang observes them (sglang/srt/managers/tokenizer_manager.py, collect_metrics):
time to first token and inter-token latency only on decode and standalone servers (a P/D
prefill server observes neither), end-to-end latency and finished requests on every server.
Time is wall time (``time.monotonic``), so Prometheus' rate() over the histograms means
what it does on a real engine.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from moe_placement.maps import FloatArray, IntArray

Role = Literal["prefill", "decode", "standalone"]
MAX_RATE = 10_000.0


@dataclass(frozen=True)
class LoadConfig:
    request_rate: float = 2.0  # offered load, requests per second
    streaming_share: float = 0.7
    prompt_tokens: int = 1024  # mean (geometric)
    output_tokens: int = 128  # mean (geometric); a P/D prefill server produces 1
    max_running: int = 128
    kv_tokens: int = 128 * (1024 + 128)  # the KV pool, tokens: 128 requests of mean length
    itl_base_s: float = 0.02
    itl_per_request_s: float = 0.0008
    prefill_tokens_per_s: float = 40_000.0
    max_prefill_tokens: int = 16_384  # prefill server: prompt tokens per pass
    queue_limit: int = 4096  # arrivals beyond it are dropped (SGLang would abort them)
    seed: int = 0


class Histogram:
    """Bucket counts of one label set; bounds are SGLang's, as exported (``le`` strings)."""

    def __init__(self, bounds: tuple[str, ...]) -> None:
        assert bounds[-1] == "+Inf"
        self.bounds = bounds
        self.uppers: FloatArray = np.array([float(b) for b in bounds])
        self.counts: IntArray = np.zeros(len(bounds), dtype=np.int64)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        if n <= 0:
            return
        self.counts[int(np.searchsorted(self.uppers, value, side="left"))] += n
        self.sum += value * n

    def cumulative(self) -> list[tuple[str, float]]:
        return [(b, float(c)) for b, c in zip(self.bounds, np.cumsum(self.counts).tolist(), strict=True)]


@dataclass
class Observed:
    """What the tokenizer manager would have observed so far (cumulative, like the metrics)."""

    ttft: dict[bool, Histogram]  # by is_streaming
    itl: Histogram
    e2e: dict[bool, Histogram]
    finished: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})


@dataclass
class Snapshot:
    running: int
    queued: int
    gen_throughput: float
    token_usage: float
    rate: float


class LoadModel:
    def __init__(
        self,
        config: LoadConfig,
        role: Role,
        buckets: dict[str, tuple[str, ...]],
        now: float,
    ) -> None:
        self.config = config
        self.role = role
        self.rng = np.random.default_rng(config.seed + 7919)
        self.rate = float(config.request_rate)
        self.observed = Observed(
            ttft={s: Histogram(buckets["ttft"]) for s in (True, False)},
            itl=Histogram(buckets["itl"]),
            e2e={s: Histogram(buckets["e2e"]) for s in (True, False)},
        )
        self.queue: deque[tuple[float, int, int, bool]] = deque()  # arrival, prompt, output, stream
        # heap: finishing pass, arrival, stream, prompt tokens, first pass (output = finishing - first + 1)
        self.running: list[tuple[int, float, bool, int, int]] = []
        self.reserved = 0  # KV tokens the running requests reserved
        # tokens held = this + running * passes: the sum over running requests of prompt - first pass
        self.held_base = 0
        self.passes = 0
        self.dropped = 0
        self.too_long = 0  # requests refused on arrival: longer than the whole KV pool
        self.clock = now  # the simulation's time; passes end at or after the wall clock
        self.arrived_until = now
        self._tokens_window: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def set_rate(self, rate: float) -> None:
        if not (math.isfinite(rate) and 0.0 <= rate <= MAX_RATE):
            raise ValueError(f"request rate must be a number in [0, {MAX_RATE:g}] requests/s")
        with self._lock:
            self.rate = float(rate)

    def _length(self, mean: int) -> int:
        return int(self.rng.geometric(1.0 / max(mean, 1)))

    def _arrivals(self, now: float) -> None:
        span = now - self.arrived_until
        if span <= 0:
            return
        c = self.config
        n = int(self.rng.poisson(self.rate * span))
        for t in np.sort(self.rng.uniform(self.arrived_until, now, n)).tolist():
            if len(self.queue) >= c.queue_limit:
                self.dropped += 1
                continue
            output = 1 if self.role == "prefill" else self._length(c.output_tokens)
            stream = bool(self.rng.random() < c.streaming_share)
            prompt = self._length(c.prompt_tokens)
            if prompt + output > c.kv_tokens:
                self.too_long += 1
                continue
            self.queue.append((t, prompt, output, stream))
        self.arrived_until = now

    def advance(self, now: float) -> None:
        """Run the engine's passes up to ``now``."""
        with self._lock:
            self._arrivals(now)
            while self.clock < now:
                if not self.running and (not self.queue or self.queue[0][0] > self.clock):
                    if not self.queue or self.queue[0][0] >= now:
                        self.clock = now  # idle until now
                        break
                    self.clock = self.queue[0][0]  # idle until the next arrival
                self._pass()

    def _pass(self) -> None:
        c, obs = self.config, self.observed
        admitted: list[tuple[float, int, int, bool]] = []
        budget = c.max_prefill_tokens
        while (
            self.queue
            and self.queue[0][0] <= self.clock
            and len(self.running) + len(admitted) < c.max_running
            and self.reserved + self.queue[0][1] + self.queue[0][2] <= c.kv_tokens
        ):
            if self.role == "prefill" and admitted and self.queue[0][1] > budget:
                break
            req = self.queue.popleft()
            budget -= req[1]
            self.reserved += req[1] + req[2]
            admitted.append(req)
        decoding = len(self.running)
        prefill_tokens = sum(r[1] for r in admitted)
        if self.role == "prefill":
            pass_s = c.itl_base_s + prefill_tokens / c.prefill_tokens_per_s
        else:
            pass_s = c.itl_base_s + c.itl_per_request_s * (decoding + len(admitted))
            if self.role == "standalone":  # chunked prefill shares the pass
                pass_s += prefill_tokens / c.prefill_tokens_per_s
        end = self.clock + pass_s
        obs.itl.observe(pass_s, decoding)
        for arrival, prompt, output, stream in admitted:
            if self.role != "prefill":
                remote = prompt / c.prefill_tokens_per_s if self.role == "decode" else 0.0
                obs.ttft[stream].observe(end - arrival + remote)
            heapq.heappush(self.running, (self.passes + output - 1, arrival, stream, prompt, self.passes))
            self.held_base += prompt - self.passes
        produced = decoding + len(admitted)
        while self.running and self.running[0][0] <= self.passes:
            finish, arrival, stream, prompt, first = heapq.heappop(self.running)
            self.reserved -= prompt + finish - first + 1
            self.held_base -= prompt - first
            obs.e2e[stream].observe(end - arrival)
            obs.finished[stream] += 1
        self._tokens_window.append((end, produced))
        while self._tokens_window and self._tokens_window[0][0] < end - 5.0:
            self._tokens_window.popleft()
        self.passes += 1
        self.clock = end

    def snapshot(self) -> Snapshot:
        with self._lock:
            tokens = sum(n for _, n in self._tokens_window)
            running = len(self.running)
            held = self.held_base + running * self.passes  # prompts and the tokens generated so far
            usage = held / self.config.kv_tokens
            return Snapshot(running, len(self.queue), tokens / 5.0, min(1.0, usage), self.rate)

    def observed_copy(self) -> Observed:
        """A consistent copy for a scrape (the replay thread keeps observing meanwhile)."""
        with self._lock:

            def copy(h: Histogram) -> Histogram:
                out = Histogram(h.bounds)
                out.counts, out.sum = h.counts.copy(), h.sum
                return out

            o = self.observed
            return Observed(
                {s: copy(h) for s, h in o.ttft.items()},
                copy(o.itl),
                {s: copy(h) for s, h in o.e2e.items()},
                dict(o.finished),
            )
