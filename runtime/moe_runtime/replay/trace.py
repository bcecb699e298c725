"""Endless per-pass routing for the replay engine, from the planner's trace model.

The calibration (per-domain skew, per-layer spread, domain overlap) is the operator's
``moe_placement.trace``: one trace model in the project. ``generate_trace`` draws a
whole [T, L, E] trace up front, which a replay that runs for hours cannot hold, so this
module steps the same dynamics one pass at a time: a drifting domain mix (slow wave plus
mean-reverting walk), a batch of sequences that persist (temporal locality), decaying
per-expert jitter, Poisson counts. Dense layers (the first ``dense_layers``) get no
counts, as in SGLang's recorder.
"""

from __future__ import annotations

import numpy as np

from moe_placement.maps import FloatArray, IntArray
from moe_placement.trace import TraceConfig, domain_popularity

__all__ = ["StreamingTrace", "TraceConfig"]


class StreamingTrace:
    def __init__(self, config: TraceConfig, dense_layers: int = 0) -> None:
        self.config = config
        self.dense_layers = dense_layers
        rng = self.rng = np.random.default_rng(config.seed)
        self.popularity: FloatArray = domain_popularity(config, rng)  # [D, L, E]
        domains = len(config.domains)
        self.phase = rng.uniform(0, 2 * np.pi, domains)
        self.period = config.drift_period * rng.uniform(0.7, 1.3, domains)
        self.decay = float(np.exp(-1.0 / config.walk_steps))
        self.walk = rng.standard_normal(domains) * config.walk_sigma
        self.step = 0
        self.running = rng.multinomial(config.batch_sequences, self.global_mix())
        self.jitter_decay = float(np.exp(-1.0 / max(config.sequence_steps, 1.0)))
        self.jitter = rng.standard_normal((config.num_layers, config.num_experts)) * config.expert_jitter

    @property
    def num_layers(self) -> int:
        return self.dense_layers + self.config.num_layers

    def global_mix(self) -> FloatArray:
        """Domain mix of the traffic arriving now: slow wave plus the walk, softmax."""
        c = self.config
        logits = c.drift_amplitude * np.sin(2 * np.pi * self.step / self.period + self.phase) + self.walk
        mix = np.exp(logits - logits.max())
        out: FloatArray = mix / mix.sum()
        return out

    def batch_mix(self) -> FloatArray:
        """Domain mix of the sequences in the current batch."""
        out: FloatArray = self.running / self.config.batch_sequences
        return out

    def _advance(self) -> None:
        c, rng = self.config, self.rng
        noise = rng.standard_normal(self.walk.shape) * c.walk_sigma * np.sqrt(1 - self.decay**2)
        self.walk = self.decay * self.walk + noise
        done = rng.binomial(self.running, 1.0 / max(c.sequence_steps, 1.0))
        self.running = self.running - done + rng.multinomial(int(done.sum()), self.global_mix())
        if c.expert_jitter > 0:
            scale = c.expert_jitter * np.sqrt(1 - self.jitter_decay**2)
            self.jitter = self.jitter_decay * self.jitter + rng.standard_normal(self.jitter.shape) * scale

    def shift(self, seed: int) -> None:
        """Move every domain's hot experts elsewhere (a per-layer permutation of expert ids).

        A test and demo facility: the traffic suddenly stops fitting any placement planned
        for it, as when a new workload lands, while its skew stays the same.
        """
        rng = np.random.default_rng(seed)
        for layer in range(self.config.num_layers):
            perm = rng.permutation(self.config.num_experts)
            self.popularity[:, layer] = self.popularity[:, layer, perm]
            self.jitter[layer] = self.jitter[layer, perm]

    def next_pass(self) -> IntArray:
        """Counts [dense + MoE layers, E] of one forward pass (tokens x top_k per MoE layer)."""
        c = self.config
        prob = np.einsum("d,dle->le", self.batch_mix(), self.popularity)
        if c.expert_jitter > 0:
            prob = prob * np.exp(self.jitter)
            prob /= prob.sum(axis=-1, keepdims=True)
        counts = np.zeros((self.num_layers, c.num_experts), dtype=np.int64)
        counts[self.dense_layers :] = self.rng.poisson(prob * (c.tokens_per_step * c.top_k))
        self.step += 1
        self._advance()
        return counts
