"""Real MoE routing (OLMoE-1B-7B, vendored in data/) batched into engine steps.

The data says which 8 of 64 experts every real token of real text was routed to, per
layer (see data/README.md). What an engine's expert counter sees also depends on how
tokens are batched and on the traffic mix, which are modelled here and named in every
figure:

* decode: ``batch`` sequences in flight, one token each per step; a sequence reads its
  domain's text in order from a random start and lasts a geometric number of steps
  (mean ``mean_length``); a finished sequence is replaced at once by a new one whose
  domain is drawn from the traffic mix of that step;
* prefill: each step is a chunk of ``chunk`` consecutive prompt tokens; prompts (log-normal
  lengths around ``mean_prompt``) are queued back to back, each from a random start in a
  domain drawn from the mix when it begins.

Traffic-mix schedules are in ``SCHEDULES``; any number of domains works (the data has
three; other routing files with more domains load the same way).
"""

from __future__ import annotations

import io
import json
import lzma
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .layout import FloatArray

DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Routes:
    """sets [D, L, N, k] uint8: the k experts of every token of every domain, per layer."""

    sets: npt.NDArray[np.uint8]
    domains: tuple[str, ...]
    layers: tuple[int, ...]
    num_experts: int

    @property
    def num_tokens(self) -> int:
        return int(self.sets.shape[2])


@cache
def load_routes(meta_file: Path = DATA / "olmoe_routes.json") -> Routes:
    """The vendored OLMoE routing (decompressed once per process, about half a second)."""
    meta = json.loads(meta_file.read_text())
    raw = lzma.decompress((meta_file.parent / meta["file"]).read_bytes())
    sets = np.load(io.BytesIO(raw), allow_pickle=False)
    if list(sets.shape) != meta["shape"] or sets.dtype != np.uint8:
        raise ValueError(
            f"{meta['file']}: expected uint8 {meta['shape']}, got {sets.dtype} {list(sets.shape)}"
        )
    return Routes(sets, tuple(meta["domains"]), tuple(meta["layers"]), int(meta["num_experts"]))


# --- traffic-mix schedules: (steps, domains, window, rng) -> [T, D], rows sum to 1 -------------


def _softmax(logits: FloatArray) -> FloatArray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    out: FloatArray = z / z.sum(axis=1, keepdims=True)
    return out


def uniform(steps: int, domains: int, window: int, rng: np.random.Generator) -> FloatArray:
    """Every domain equally often, all the time."""
    return np.full((steps, domains), 1.0 / domains)


def single(steps: int, domains: int, window: int, rng: np.random.Generator) -> FloatArray:
    """One domain (drawn per seed) carries all traffic."""
    out = np.zeros((steps, domains))
    out[:, rng.integers(domains)] = 1.0
    return out


def phases(steps: int, domains: int, window: int, rng: np.random.Generator) -> FloatArray:
    """Piecewise-constant mixes: a random dominant domain (70%) for 2-6 windows at a time."""
    out = np.empty((steps, domains))
    t = 0
    while t < steps:
        length = int(rng.integers(2, 7)) * window
        mix = np.full(domains, 0.3 / max(domains - 1, 1))
        mix[rng.integers(domains)] = 0.7 if domains > 1 else 1.0
        out[t : t + length] = mix
        t += length
    return out


def walk(steps: int, domains: int, window: int, rng: np.random.Generator) -> FloatArray:
    """Mean-reverting random walk of the mix logits (sd 1, correlation time 2 windows)."""
    decay = np.exp(-1.0 / (2.0 * window))
    logits = np.empty((steps, domains))
    logits[0] = rng.standard_normal(domains)
    noise = rng.standard_normal((steps, domains)) * np.sqrt(1 - decay**2)
    for t in range(1, steps):
        logits[t] = decay * logits[t - 1] + noise[t]
    return _softmax(logits)


def diurnal(steps: int, domains: int, window: int, rng: np.random.Generator) -> FloatArray:
    """Smooth waves (period 10-14 windows, random phases) of the mix logits, amplitude 1.5."""
    t = np.arange(steps)[:, None]
    period = window * rng.uniform(10, 14, domains)
    return _softmax(1.5 * np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi, domains)))


def shift(steps: int, domains: int, window: int, rng: np.random.Generator) -> FloatArray:
    """One mix, then at a random step in the second half a different one (Dirichlet draws)."""
    at = int(rng.integers(steps // 2, max(steps // 2 + 1, steps - window)))
    out = np.empty((steps, domains))
    out[:at] = rng.dirichlet(np.ones(domains))
    out[at:] = rng.dirichlet(np.ones(domains))
    return out


def burst(steps: int, domains: int, window: int, rng: np.random.Generator) -> FloatArray:
    """A steady mix interrupted by short bursts (a quarter to a half window) of one domain at 80%."""
    base = rng.dirichlet(2 * np.ones(domains))
    out = np.broadcast_to(base, (steps, domains)).copy()
    t = int(rng.exponential(window))
    while t < steps:
        length = int(rng.integers(window // 4, window // 2 + 1))
        mix = 0.2 * base
        mix[rng.integers(domains)] += 0.8
        out[t : t + length] = mix
        t += length + int(rng.exponential(1.5 * window))
    return out


Schedule = Callable[[int, int, int, np.random.Generator], FloatArray]
SCHEDULES: dict[str, Schedule] = {
    "uniform": uniform,
    "single": single,
    "phases": phases,
    "walk": walk,
    "diurnal": diurnal,
    "shift": shift,
    "burst": burst,
}


# --- batching into engine steps ----------------------------------------------------------------


def _count(routes: Routes, domain: np.ndarray, position: np.ndarray, steps: int) -> FloatArray:
    """Counts [T, L, E] of tokens (domain, position) [T, n] read at each step."""
    num_layers, num_experts = routes.sets.shape[1], routes.num_experts
    out = np.empty((steps, num_layers, num_experts))
    step_key = (np.arange(steps)[:, None, None] * num_experts).astype(np.int64)
    for layer in range(num_layers):
        experts = routes.sets[domain, layer, position].astype(np.int64)  # [T, n, k]
        flat = (step_key + experts).ravel()
        out[:, layer] = np.bincount(flat, minlength=steps * num_experts).reshape(steps, num_experts)
    return out


def decode_counts(
    routes: Routes, mix: FloatArray, *, batch: int, mean_length: float, rng: np.random.Generator
) -> FloatArray:
    """Per-step expert counts [T, L, E] of ``batch`` decoding sequences (see the module doc)."""
    steps, num_domains = mix.shape
    if num_domains != len(routes.domains):
        raise ValueError(f"mix has {num_domains} domains, routes have {len(routes.domains)}")
    num_tokens = routes.num_tokens
    domain = np.empty((steps, batch), dtype=np.int64)
    position = np.empty((steps, batch), dtype=np.int64)
    cum_mix = np.cumsum(mix, axis=1)
    t = np.arange(steps)
    p = 1.0 / max(mean_length, 1.0)
    for slot in range(batch):
        lengths = rng.geometric(p, size=int(2 * steps * p) + 8)
        while lengths.sum() < steps:
            lengths = np.concatenate([lengths, rng.geometric(p, size=lengths.size)])
        ends = np.cumsum(lengths)
        begins = ends - lengths
        used = int(np.searchsorted(ends, steps)) + 1
        begins, ends = begins[:used], ends[:used]
        seq_dom = (rng.random(used)[:, None] > cum_mix[np.minimum(begins, steps - 1)]).sum(axis=1)
        seq_start = rng.integers(0, num_tokens, size=used)
        seq = np.searchsorted(ends, t, side="right")
        domain[:, slot] = np.minimum(seq_dom[seq], num_domains - 1)
        position[:, slot] = (seq_start[seq] + t - begins[seq]) % num_tokens
    return _count(routes, domain, position, steps)


def prefill_counts(
    routes: Routes, mix: FloatArray, *, chunk: int, mean_prompt: float, rng: np.random.Generator
) -> FloatArray:
    """Per-step expert counts [T, L, E] of prefill chunks of ``chunk`` prompt tokens."""
    steps, num_domains = mix.shape
    if num_domains != len(routes.domains):
        raise ValueError(f"mix has {num_domains} domains, routes have {len(routes.domains)}")
    num_tokens = routes.num_tokens
    total = steps * chunk
    sigma = 0.75
    mu = np.log(mean_prompt) - sigma**2 / 2
    guess = int(1.5 * total / mean_prompt) + 16
    lengths = np.clip(rng.lognormal(mu, sigma, size=guess), 16, 4 * mean_prompt).astype(np.int64)
    while lengths.sum() < total:
        more = np.clip(rng.lognormal(mu, sigma, size=guess), 16, 4 * mean_prompt).astype(np.int64)
        lengths = np.concatenate([lengths, more])
    ends = np.cumsum(lengths)
    used = int(np.searchsorted(ends, total)) + 1
    lengths, ends = lengths[:used], ends[:used]
    begins = ends - lengths
    cum_mix = np.cumsum(mix, axis=1)
    dom = (rng.random(used)[:, None] > cum_mix[np.minimum(begins // chunk, steps - 1)]).sum(axis=1)
    dom = np.minimum(dom, num_domains - 1)
    start = rng.integers(0, num_tokens, size=used)
    index = np.arange(total)
    prompt = np.searchsorted(ends, index, side="right")
    position = (start[prompt] + index - begins[prompt]) % num_tokens
    return _count(routes, dom[prompt].reshape(steps, chunk), position.reshape(steps, chunk), steps)
