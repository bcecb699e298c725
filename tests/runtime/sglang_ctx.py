"""Run SGLang's real expert-location code on CPU without a model or a server.

``ExpertLocationMetadata.init_by_eplb`` reads the process's runtime context
(``get_exec``/``get_parallel``/``get_device``) and the model class's expert-location
config. Publishing a real ServerArgs needs transformers, torchvision and more, so the
tests replace just those accessors in the expert_location module with plain namespaces
carrying the fields it reads; everything else (rebalance_experts, the hook registry,
_init_raw, the static dispatch table) is SGLang's own code.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SimpleNamespace = types.SimpleNamespace


@contextmanager
def expert_location_context(
    *,
    num_layers: int,
    num_experts: int,
    ep_size: int,
    num_redundant: int,
    nnodes: int = 1,
    num_groups: int | None = None,
    dispatch: str = "dynamic",
    algorithm: str = "deepseek",
) -> Iterator[Any]:
    from sglang.srt.eplb import expert_location as el

    moe = SimpleNamespace(
        ep_num_redundant_experts=num_redundant,
        eplb_algorithm=algorithm,
        ep_dispatch_algorithm=dispatch,
        moe_a2a_backend="deepep",
        ep_join_mode="none",
    )
    parallel = SimpleNamespace(ep_size=ep_size, nnodes=nnodes, elastic_ep_initial_size=None, tp_size=ep_size)
    saved = {name: getattr(el, name) for name in ("get_exec", "get_parallel", "get_device")}
    saved_cfg = el.ModelConfigForExpertLocation.from_model_config
    el.get_exec = lambda: SimpleNamespace(moe=moe)
    el.get_parallel = lambda: parallel
    el.get_device = lambda: SimpleNamespace(device="cpu")
    el.ModelConfigForExpertLocation.from_model_config = staticmethod(  # type: ignore[method-assign]
        lambda model_config: el.ModelConfigForExpertLocation(
            num_layers=num_layers, num_logical_experts=num_experts, num_groups=num_groups
        )
    )
    try:
        yield el
    finally:
        for name, value in saved.items():
            setattr(el, name, value)
        el.ModelConfigForExpertLocation.from_model_config = staticmethod(saved_cfg)  # type: ignore[method-assign]


@contextmanager
def plugin_hook_installed() -> Iterator[Any]:
    """Register the plugin through SGLang's HookRegistry (as load_plugins does), undo afterwards."""
    from sglang.srt.eplb import eplb_algorithms
    from sglang.srt.plugins.hook_registry import HookRegistry

    from moe_runtime import sglang_plugin

    original = eplb_algorithms.rebalance_experts
    HookRegistry.reset()
    sglang_plugin.register()
    HookRegistry.apply_hooks()
    wrapped = eplb_algorithms.rebalance_experts
    assert wrapped is not original and wrapped.__wrapped__ is original
    try:
        yield original
    finally:
        for mod in list(sys.modules.values()):
            for attr, value in list(getattr(mod, "__dict__", {}).items()):
                if value is wrapped:
                    setattr(mod, attr, original)
        HookRegistry.reset()
        sglang_plugin.reset_state()
