"""Expert placement (EPLB) for Mixture-of-Experts inference: planner, baseline, traces, bench.

Pure numpy, no I/O. ``plan`` turns a history of per-expert loads into an SGLang
``physical_to_logical_map``; ``plan_instances`` does it per engine instance (its own
windows, the pool's as a prior); ``baseline_plan`` is our re-implementation of DeepSeek's EPLB
for side-by-side comparison; ``balancedness`` is SGLang's per-layer metric.
"""

from .baseline import baseline_plan
from .instances import plan_instances
from .metrics import balancedness, gpu_loads
from .planner import Plan, plan
from .trace import Trace, TraceConfig, generate_trace

__all__ = [
    "Plan",
    "Trace",
    "TraceConfig",
    "balancedness",
    "baseline_plan",
    "generate_trace",
    "gpu_loads",
    "plan",
    "plan_instances",
]
