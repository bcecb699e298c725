"""The recipe: the engine settings a wide-EP pool needs, derived from model x hardware x role x size.

Pure functions over the spec, the model catalog and the hardware profiles. Every derived setting
names the rule and the public source behind it (SGLang 0.5.23's or DeepEP's code, or a public
reference deployment), so ``moe-operator render --explain`` can show why each one is there. The
user's extraArgs and env still win; ``checks`` holds the same rules against what the pool ends up
with (derived plus user), refusing what cannot start and warning about what loses throughput.
"""

from .checks import recipe_findings
from .context import PoolContext, pool_context
from .derive import (
    derive_pool,
    effective_args,
    effective_env,
    kv_needs_one_domain,
    router_policy,
    router_role_policies,
)
from .findings import Finding
from .setting import Setting
from .startup import startup_timeout_s

__all__ = [
    "Finding",
    "PoolContext",
    "Setting",
    "derive_pool",
    "effective_args",
    "effective_env",
    "kv_needs_one_domain",
    "pool_context",
    "recipe_findings",
    "router_policy",
    "router_role_policies",
    "startup_timeout_s",
]
