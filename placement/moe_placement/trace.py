"""Seeded synthetic routing traces, calibrated to measured MoE routing skew.

Why synthetic: no GPU exists on the development machines, yet a balancer must be scored on
traffic that behaves like the real thing. Calibration (seed article 001, OLMoE-1B-7B):
the busiest expert of a layer gets ~3.1x its fair share on prose (2.2x-4.2x across layers)
and ~6.9x on code, and hot sets of different domains barely overlap (independent logits
share about 1 of the 8 hottest experts, as measured). Gaussian logits with that peak also
reproduce the measured EP=8 imbalance of a sequential placement (1.32 prose).

Structure of a trace, per step t, layer l, expert e:
* a traffic mix over domains that drifts (a slow diurnal-like wave plus a mean-reverting
  random walk in logit space);
* a batch of sequences that persist for several steps (temporal locality): the step's mix
  is that of the running sequences, not the global mix;
* per-expert affinity jitter that decays over a sequence lifetime (topic locality); it is
  one sequence's affinity spread divided by sqrt(sequences in flight), because a batch
  averages the topics of its sequences (thousands in a large decode batch, a few dozen
  prompts in a prefill batch);
* cross-layer correlation: every layer sees the same batch, so their loads move together;
* finite-batch sampling: Poisson counts with mean tokens * top_k * probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import FloatArray

DEFAULT_DOMAINS: tuple[tuple[str, float], ...] = (("prose", 3.1), ("code", 6.9), ("chat", 2.6), ("math", 4.5))


@dataclass(frozen=True)
class TraceConfig:
    """Knobs of a synthetic trace; defaults are an OLMoE-like model under mixed traffic."""

    num_layers: int = 16
    num_experts: int = 64
    top_k: int = 8
    tokens_per_step: int = 4096
    num_steps: int = 1024
    seed: int = 0
    domains: tuple[tuple[str, float], ...] = DEFAULT_DOMAINS  # (name, busiest expert / fair share)
    layer_spread: tuple[float, float] = (2.2 / 3.1, 4.2 / 3.1)  # per-layer factor on the peak
    drift_period: float = 4096.0  # steps per cycle of the slow wave of the traffic mix
    drift_amplitude: float = 1.2  # logit amplitude of the slow wave
    walk_sigma: float = 0.6  # stationary logit sd of the mean-reverting walk
    walk_steps: float = 512.0  # its correlation time, steps
    batch_sequences: int = 4096  # sequences in flight in a step (decode: one token each)
    sequence_steps: float = 48.0  # mean steps a sequence stays in the batch
    sequence_affinity: float = 1.0  # log-sd of one sequence's expert affinity around its domain

    @property
    def expert_jitter(self) -> float:
        """log-sd of the batch's per-expert affinity: sequences average each other out."""
        return self.sequence_affinity / float(np.sqrt(max(self.batch_sequences, 1)))


@dataclass(frozen=True)
class Trace:
    """counts [T, L, E] (token-expert assignments per step) and the hidden truth behind them."""

    counts: FloatArray
    mix: FloatArray  # [T, D] domain mix of each step's batch
    popularity: FloatArray  # [D, L, E] per-domain routing probability (sums to 1 per layer)
    config: TraceConfig


def domain_popularity(config: TraceConfig, rng: np.random.Generator) -> FloatArray:
    """[D, L, E] routing distributions whose peak equals the domain's ratio times a layer factor."""
    num_domains = len(config.domains)
    logits = rng.standard_normal((num_domains, config.num_layers, config.num_experts))
    layer_factor = rng.uniform(*config.layer_spread, size=config.num_layers)
    cap = 0.9 * config.num_experts / config.top_k  # an expert is picked at most once per token
    ratio = np.array([r for _, r in config.domains])[:, None] * layer_factor[None, :]
    target = np.minimum(ratio, cap) / config.num_experts  # peak probability
    shifted = logits - logits.max(axis=-1, keepdims=True)
    low = np.zeros(target.shape)
    high = np.full(target.shape, 50.0)
    for _ in range(60):  # bisection on the softmax temperature: the peak grows with beta
        beta = (low + high) / 2
        peak = 1.0 / np.exp(beta[..., None] * shifted).sum(axis=-1)
        low = np.where(peak < target, beta, low)
        high = np.where(peak < target, high, beta)
    prob = np.exp(((low + high) / 2)[..., None] * shifted)
    out: FloatArray = prob / prob.sum(axis=-1, keepdims=True)
    return out


def traffic_mix(config: TraceConfig, rng: np.random.Generator) -> FloatArray:
    """[T, D] global domain mix: slow wave plus mean-reverting walk, softmax of logits."""
    num_domains = len(config.domains)
    steps = np.arange(config.num_steps)[:, None]
    phase = rng.uniform(0, 2 * np.pi, num_domains)
    period = config.drift_period * rng.uniform(0.7, 1.3, num_domains)
    wave = config.drift_amplitude * np.sin(2 * np.pi * steps / period + phase)
    decay = np.exp(-1.0 / config.walk_steps)
    noise = rng.standard_normal((config.num_steps, num_domains)) * config.walk_sigma * np.sqrt(1 - decay**2)
    walk = np.empty((config.num_steps, num_domains))
    walk[0] = rng.standard_normal(num_domains) * config.walk_sigma
    for t in range(1, config.num_steps):
        walk[t] = decay * walk[t - 1] + noise[t]
    logits = wave + walk
    mix = np.exp(logits - logits.max(axis=1, keepdims=True))
    out: FloatArray = mix / mix.sum(axis=1, keepdims=True)
    return out


def batch_mix(global_mix: FloatArray, config: TraceConfig, rng: np.random.Generator) -> FloatArray:
    """[T, D] mix of the sequences actually in each step's batch (birth-death of sequences)."""
    num_steps, num_domains = global_mix.shape
    finish = 1.0 / max(config.sequence_steps, 1.0)
    running = rng.multinomial(config.batch_sequences, global_mix[0])
    out = np.empty((num_steps, num_domains))
    for t in range(num_steps):
        done = rng.binomial(running, finish)
        running = running - done + rng.multinomial(int(done.sum()), global_mix[t])
        out[t] = running / config.batch_sequences
    return out


def generate_trace(
    config: TraceConfig,
    *,
    global_mix: FloatArray | None = None,
    volume: FloatArray | None = None,
    replica: int = 0,
) -> Trace:
    """Draw a trace; the same config (seed included) always gives the same counts.

    ``global_mix`` [T, D] replaces the drifting mix (wave plus walk) by a given schedule;
    ``volume`` [T] scales the tokens of each step (bursty load). Both default to the model above.
    ``replica`` > 0 draws another engine's batches of the same traffic: the same domains and
    global mix, its own sequences, jitter and sampling.
    """
    rng = np.random.default_rng(config.seed)
    popularity = domain_popularity(config, rng)
    steps, domains = config.num_steps, len(config.domains)
    if global_mix is not None and np.shape(global_mix) != (steps, domains):
        raise ValueError(f"global_mix must have shape [{steps}, {domains}], got {list(np.shape(global_mix))}")
    if volume is not None and np.shape(volume) != (steps,):
        raise ValueError(f"volume must have shape [{steps}], got {list(np.shape(volume))}")
    wanted = traffic_mix(config, rng) if global_mix is None else np.asarray(global_mix, dtype=np.float64)
    if replica:
        rng = np.random.default_rng((config.seed, replica))
    mix = batch_mix(wanted, config, rng)
    prob = np.einsum("td,dle->tle", mix, popularity)
    if config.expert_jitter > 0:
        decay = np.exp(-1.0 / max(config.sequence_steps, 1.0))
        shape = (config.num_layers, config.num_experts)
        jitter = rng.standard_normal(shape) * config.expert_jitter
        scale = config.expert_jitter * np.sqrt(1 - decay**2)
        for t in range(config.num_steps):
            jitter = decay * jitter + rng.standard_normal(shape) * scale
            prob[t] *= np.exp(jitter)
        prob /= prob.sum(axis=-1, keepdims=True)
    scale = float(config.tokens_per_step * config.top_k)
    per_step = scale if volume is None else scale * np.asarray(volume, dtype=np.float64)[:, None, None]
    counts = rng.poisson(prob * per_step).astype(np.float64)
    return Trace(counts=counts, mix=mix, popularity=popularity, config=config)
