"""One rank of the recorder test: SGLang 0.5.23's real stat-mode recorder on CPU under gloo.

argv: rank world port plan.json. Every rank builds SGLang's _ExpertDistributionRecorderReal
over a real ExpertLocationMetadata (a map with redundant copies), records the plan's passes
through on_select_experts (physical ids, per layer) inside with_forward_pass, then calls
dump_record(): SGLang all-reduces the buffer and global rank 0 alone writes the .pt file into
$SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR. Only the accessors of SGLang's runtime context that
need a launched server are replaced (as tests/runtime/sglang_ctx.py does for expert_location).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    rank, world, port = (int(x) for x in sys.argv[1:4])
    plan = json.loads(Path(sys.argv[4]).read_text())

    import torch
    import torch.distributed as dist
    from sglang_ctx import expert_location_context

    _einops_if_missing()
    _forward_batch_types()
    from sglang.srt.eplb import expert_distribution as ed

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    layers, experts = plan["layers"], plan["experts"]
    phy2log = torch.tensor(plan["phy2log"], dtype=torch.int64)
    redundant = phy2log.shape[1] - experts
    with expert_location_context(
        num_layers=layers, num_experts=experts, ep_size=world, num_redundant=redundant
    ) as el:
        meta = el.ExpertLocationMetadata.init_by_mapping(None, phy2log, moe_ep_rank=rank)

    moe = types.SimpleNamespace(
        expert_distribution_recorder_mode="stat",
        expert_distribution_recorder_buffer_size=plan["buffer"],
        expert_balancedness_report_mode="off",
        eplb_min_rebalancing_utilization_threshold=1.0,
        moe_a2a_backend="none",
        deepep_mode="auto",
        elastic_ep_backend=None,
    )
    ed.get_exec = lambda: types.SimpleNamespace(moe=moe)
    ed.get_device_namespace = lambda: types.SimpleNamespace(device="cpu")
    ed.get_device = lambda: "cpu"
    ed.reports_expert_balancedness = lambda: False
    ed.megamoe_prefill_only_recorder_enabled = lambda: False

    rec = ed.ExpertDistributionRecorder.init_new(meta, rank)
    assert type(rec).__name__ == "_ExpertDistributionRecorderReal"
    rec.start_record()
    for pass_id, per_layer in enumerate(plan["passes"][rank]):
        with rec.with_forward_pass(pass_id, types.SimpleNamespace()):
            for layer, topk in enumerate(per_layer):
                if topk:
                    with rec.with_current_layer(layer):
                        rec.on_select_experts(torch.tensor(topk, dtype=torch.int32))
    if plan.get("eplb"):
        _rebalance_through_the_plugin(ed, rec, plan, world)
    else:
        rec.dump_record()
    dist.barrier()
    dist.destroy_process_group()


def _rebalance_through_the_plugin(ed: types.ModuleType, rec: object, plan: dict, world: int) -> None:
    """What EPLBManager.rebalance does at a rebalance: dump_record(output_mode="object") on the
    global recorder, then ExpertLocationMetadata.init_by_eplb on its logical_count, which calls
    rebalance_experts and so the plugin (installed through SGLang's HookRegistry)."""
    from sglang_ctx import expert_location_context, plugin_hook_installed

    from moe_runtime import sglang_plugin

    ed.set_global_expert_distribution_recorder(rec)
    out = ed.get_global_expert_distribution_recorder().dump_record(output_mode="object")
    layers, experts = plan["layers"], plan["experts"]
    redundant = len(plan["phy2log"][0]) - experts
    with (
        plugin_hook_installed(),
        expert_location_context(
            num_layers=layers, num_experts=experts, ep_size=world, num_redundant=redundant
        ) as el,
    ):
        el.ExpertLocationMetadata.init_by_eplb(None, out["logical_count"])
    sglang_plugin.hook_state().flush()


def _einops_if_missing() -> None:
    """expert_distribution imports einops at module level but uses it only to score balancedness
    (report mode off here). SGLang's wheel depends on it; the test venv may lack it: a stub that
    refuses to be used keeps the dump path SGLang's own."""
    try:
        import einops  # noqa: F401
    except ImportError:
        stub = types.ModuleType("einops")

        def reduce(*args: object, **kwargs: object) -> object:
            raise NotImplementedError("einops stub: balancedness reporting is off in this test")

        stub.reduce = reduce  # type: ignore[attr-defined]
        sys.modules["einops"] = stub


def _forward_batch_types() -> None:
    """expert_distribution imports ForwardBatch (type hints only), ForwardMode and, through
    metrics_collector, DisaggregationMode; their modules pull in every model config
    (transformers). When those cannot import, the enums are compiled from the real modules'
    source (as tools/sglang_metrics.py does) and ForwardBatch is a bare class: the recorder
    code stays SGLang's own (the batch given to with_forward_pass is never read here)."""
    import ast
    import importlib.util

    wanted = {
        "sglang.srt.disaggregation.utils": ("DisaggregationMode",),
        "sglang.srt.model_executor.forward_batch_info": ("ForwardMode",),
    }
    for name, classes in wanted.items():
        try:
            importlib.import_module(name)
            continue
        except ImportError:
            pass
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, name
        tree = ast.parse(Path(spec.origin).read_text())
        found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in classes]
        assert [n.name for n in found] == list(classes), name
        head = ast.parse("from enum import Enum, IntEnum, auto\nfrom typing import Optional").body
        module = types.ModuleType(name)
        module.__file__ = spec.origin
        exec(compile(ast.Module(body=[*head, *found], type_ignores=[]), spec.origin, "exec"), module.__dict__)
        if name.endswith("forward_batch_info"):
            module.ForwardBatch = type("ForwardBatch", (), {})  # type: ignore[attr-defined]
        sys.modules[name] = module


if __name__ == "__main__":
    main()
