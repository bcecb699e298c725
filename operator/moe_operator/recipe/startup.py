"""How long a pod group may take to start before the operator restarts it."""

from __future__ import annotations

from ..api import MoEDeploymentSpec
from ..api.derived import pools, resolve_architecture, weight_dtype
from ..api.types import parse_duration

DEFAULT_STARTUP_S = 30 * 60
COLD_DEEPGEMM_STARTUP_S = 60 * 60
"""A multi-node instance of an FP8 block-quantised model compiles DeepGEMM kernels on its first start
(SGLang's DeepGEMM pre-compile: 10-20 minutes for the first rank of each node, on top of loading
hundreds of GB of weights and capturing CUDA graphs). Public wide-EP deployments allow 45 minutes
(llm-d wide-ep-lws startupProbe 2700 x 1 s) to 100 minutes (Dynamo's SGLang wide-EP recipes,
600 x 10 s); 60 minutes sits between them."""
WARM_DEEPGEMM_STARTUP_S = 45 * 60
"""With spec.engine.kernelCacheClaim the compiled kernels survive group restarts: llm-d's 45 minutes.
The first start on an empty cache is as slow as a cold one, which start-up progress covers (a start
that keeps moving gets up to twice the allowance: docs/operator.md, "Start-up")."""


def startup_timeout_s(spec: MoEDeploymentSpec) -> float:
    """spec.engine.startupTimeout, or the default for the model and the instance sizes."""
    if spec.engine.startup_timeout is not None:
        return parse_duration(spec.engine.startup_timeout)
    arch = resolve_architecture(spec.model)
    deepgemm = arch is not None and arch.fp8_block is not None and weight_dtype(spec.model, arch) == "fp8"
    multi_node = any(p.nodes_per_replica > 1 for p in pools(spec).values())
    if not (deepgemm and multi_node):
        return float(DEFAULT_STARTUP_S)
    return float(WARM_DEEPGEMM_STARTUP_S if spec.engine.kernel_cache_claim else COLD_DEEPGEMM_STARTUP_S)
