"""The replay loop: one synthetic forward pass at a time, a rebalance every N passes.

Per pass it does what SGLang's recorder does with the routed counts: spread them over
the physical copies by the dispatch rule, sum per GPU and report the pass's
balancedness (SGLang's formula, averaged over all layers, dense layers count as 1.0).
Every ``rebalance_iterations`` passes it calls the plugin's hook code with the window,
exactly where SGLang's EPLBManager calls ``rebalance_experts``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from moe_placement.maps import (
    Dispatch,
    FloatArray,
    IntArray,
    balancedness,
    gpu_loads,
    slot_shares,
    trivial_map,
)
from moe_runtime import eplb_hook
from moe_runtime.replay.baseline import deepseek_global
from moe_runtime.replay.sglang_metrics import SGLangMetrics
from moe_runtime.replay.trace import StreamingTrace, TraceConfig

log = logging.getLogger("moe_runtime.replay")


@dataclass(frozen=True)
class ReplayOptions:
    trace: TraceConfig = field(default_factory=TraceConfig)
    dense_layers: int = 0
    num_gpus: int = 32
    gpus_per_node: int = 8
    num_redundant: int = 32
    num_groups: int | None = None
    rebalance_iterations: int = 1000
    pass_interval_s: float = 0.05
    dispatch: Dispatch = "static"
    forward_mode: Literal["extend", "decode"] = "decode"

    @property
    def num_physical(self) -> int:
        return self.trace.num_experts + self.num_redundant

    @property
    def num_layers(self) -> int:
        return self.dense_layers + self.trace.num_layers

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)


class ReplayEngine:
    def __init__(self, opts: ReplayOptions, hook: eplb_hook.HookState, sglang: SGLangMetrics) -> None:
        if opts.num_physical % opts.num_gpus:
            raise ValueError(
                f"experts + redundant = {opts.num_physical} must be a multiple of the {opts.num_gpus} GPUs"
            )
        self.opts = opts
        self.hook = hook
        self.sglang = sglang
        self.trace = StreamingTrace(opts.trace, opts.dense_layers)
        t = opts.trace
        self.shape = eplb_hook.EngineShape(
            num_layers=opts.num_layers,
            num_logical=t.num_experts,
            num_physical=opts.num_physical,
            num_gpus=opts.num_gpus,
            num_nodes=opts.num_nodes,
            num_groups=opts.num_groups,
        )
        self.phy2log: IntArray = trivial_map(opts.num_layers, t.num_experts, opts.num_physical)
        self.shares: FloatArray = self._shares(self.phy2log)
        self.window = np.zeros((opts.num_layers, t.num_experts), dtype=np.int64)
        self.window_passes = 0
        self.passes = 0
        self.rebalances = 0
        self.last_decision: eplb_hook.Decision | None = None
        self.shifts = 0
        self._pending_shift: int | None = None
        self._shift_lock = threading.Lock()
        self._stop = threading.Event()

    def _shares(self, phy2log: IntArray) -> FloatArray:
        return slot_shares(
            phy2log,
            self.opts.trace.num_experts,
            self.opts.num_gpus,
            dispatch=self.opts.dispatch,
            gpus_per_node=self.opts.gpus_per_node,
        )

    def set_map(self, phy2log: IntArray) -> None:
        self.phy2log = phy2log
        self.shares = self._shares(phy2log)

    def request_shift(self, seed: int) -> None:
        """Shift the traffic mix before the next pass (test/demo facility; see StreamingTrace.shift)."""
        with self._shift_lock:
            self._pending_shift = seed

    def step(self) -> float:
        """One forward pass; returns its balancedness as SGLang would report it."""
        with self._shift_lock:
            seed, self._pending_shift = self._pending_shift, None
        if seed is not None:  # applied here, in the replay thread, so a pass never sees half a shift
            self.trace.shift(seed)
            self.shifts += 1
            log.info("traffic shifted (seed %d)", seed)
        counts = self.trace.next_pass()
        gpu = gpu_loads(counts, self.phy2log, self.shares, self.opts.num_gpus)
        bal = float(balancedness(gpu).mean())
        self.sglang.observe_pass(bal, self.opts.forward_mode)
        self.window += counts
        self.window_passes += 1
        self.passes += 1
        if self.passes % self.opts.rebalance_iterations == 0:
            self.rebalance()
        return bal

    def rebalance(self) -> eplb_hook.Decision:
        """The hook, called with the window SGLang's EPLBManager would hand over."""
        window = self.window
        shape = self.shape

        def original() -> IntArray:
            return deepseek_global(window, shape.num_gpus, shape.num_redundant)

        decision, applied = eplb_hook.rebalance_single_process(
            self.hook, window, self.window_passes, shape, original, current=self.phy2log
        )
        self.set_map(applied)
        self.window = np.zeros_like(window)  # SGLang's dump resets the recorder
        self.window_passes = 0
        self.rebalances += 1
        self.last_decision = decision
        log.info("rebalance %d: %s (%s)", self.rebalances, decision.source, decision.reason)
        return decision

    def run(self) -> None:
        """Blocking loop (run it in a thread); stops on stop()."""
        t = self.opts.trace
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("replay pass failed")
            interval = self.opts.pass_interval_s
            if interval > 0:
                self.sglang.set_load(
                    running=t.batch_sequences, throughput=t.tokens_per_step / interval, usage=0.5
                )
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                else:
                    next_at = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
