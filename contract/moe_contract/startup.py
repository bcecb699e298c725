"""The start-up phases of an engine pod's SGLang, in the order SGLang 0.5.23 goes through them.

The runtime reports the phase its engine is in (GET /v1/status "start", the
``moe_runtime_start_phase`` gauge); the names live here so the operator can read them without
a copy that drifts. A phase may be skipped (no CUDA graphs, no DeepGEMM, no P/D warmup), never
revisited.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

StartPhase = Literal[
    "launching",  # the launcher started SGLang, which parses its arguments and spawns schedulers
    "distributed_init",  # torch.distributed and the parallel groups (NCCL, DeepEP buffers)
    "loading_weights",
    "kv_cache",  # the KV pool is allocated; attention backends and graph buffers follow
    "cuda_graphs",  # capturing the prefill and decode CUDA graphs
    "deepgemm_warmup",  # DeepGEMM's JIT compiles its kernels (10-20 min when its cache is cold)
    "warmup",  # P/D disaggregation's warmup requests
    "ready",
]
START_PHASES: Final[tuple[StartPhase, ...]] = get_args(StartPhase)
