"""Run SGLang 0.5.23's own server-argument resolution and checks on one engine command, on CPU.

Usage: python sglang_resolve.py < request.json, where the request holds ``argv`` (the arguments after
``-m sglang.launch_server``), ``env`` (the engine's environment) and ``gpu`` (``sm``: 90 or 100,
``memMiB``: the GPU's memory as nvidia-smi reports it). Prints the resolved fields as JSON, or
exits 1 with SGLang's own error on stderr.

One command per process: resolution writes os.environ and a ServerArgs resolves only once. Stubbed,
because this host has none of it: the platform facts (SGLang's official override_platform hook),
the device and its memory (nvidia-smi), the InfiniBand sysfs check of --disaggregation-ib-device,
and the prefill CUDA-graph default that asks torch for CUDA. Everything else (ServerArgs,
prepare_server_args, resolve_once, check_server_args, the model config from config.json) is SGLang's.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    request = json.load(sys.stdin)
    os.environ.update(request.get("env") or {})
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    gpu = request["gpu"]
    sm, mem_mib = int(gpu["sm"]), float(gpu["memMiB"])

    from sglang.srt.runtime_context import override_platform

    blackwell = sm >= 100
    override_platform(
        is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False,
        is_sm90=sm == 90, is_sm100=sm == 100, is_sm100_or_sm110=blackwell, is_sm110=False,
        is_sm120=False, is_blackwell=blackwell, is_hopper_with_cuda_12_3=sm == 90, has_amx=False,
        has_flashinfer=True, device_sm=sm, device_capability=(sm // 10, sm % 10),
    ).install()  # fmt: skip

    import sglang.srt.arg_groups.kv_shard_hook as kv_shard_hook
    import sglang.srt.arg_groups.memory_hook as memory_hook
    import sglang.srt.arg_groups.serving_hook as serving_hook
    import sglang.srt.arg_groups.validation_hook as validation_hook
    import sglang.srt.model_executor.cuda_graph_config as cgc
    import sglang.srt.utils.common as common

    def capacity(device: object = None) -> float:
        return mem_mib

    for module in (common, memory_hook, kv_shard_hook):
        module.get_device_memory_capacity = capacity  # type: ignore[attr-defined]
    cgc.default_prefill_backend = lambda: cgc.Backend.BREAKABLE  # type: ignore[assignment]

    def device(device_id: object = None) -> str:
        return "cuda" if device_id is None else f"cuda:{device_id}"

    common.get_device = device  # type: ignore[assignment]
    if hasattr(serving_hook, "get_device"):
        serving_hook.get_device = device
    validation_hook.validate_ib_devices = lambda s: s  # no /sys/class/infiniband here

    from sglang.srt.server_args import prepare_server_args

    try:
        args = prepare_server_args(list(request["argv"]))
        args.resolve_once()
        args.check_server_args()
    except Exception as exc:  # SGLang's own refusal, reported as such
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    resolved = args.resolved_dict()
    graphs = resolved.get("cuda_graph_config") or {}
    out = {k: v for k, v in resolved.items() if isinstance(v, (str, int, float, bool, type(None)))}
    for phase in ("decode", "prefill"):
        p = graphs.get(phase) or {}
        out[f"cuda_graph_{phase}_backend"] = str(p.get("backend"))
        out[f"cuda_graph_{phase}_max_bs"] = max(p.get("bs") or [0])
    dense = request.get("denseFfn")
    if dense:
        out["dense_fp8_error"] = _dense_fp8_error(
            dense, int(resolved.get("moe_dense_tp_size") or args.tp_size)
        )
    print(json.dumps(out, default=str))
    return 0


def _dense_fp8_error(dense: dict[str, int], tp: int) -> str | None:
    """SGLang's own check of the dense FFN's FP8 blocks at ``tp`` (what weight loading runs first)."""
    from types import SimpleNamespace

    from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod

    hidden, inter, block = dense["hidden"], dense["intermediate"], dense["block"]
    quant = SimpleNamespace(weight_block_size=[block, block])
    layer = SimpleNamespace(tp_group=SimpleNamespace(world_size=tp))
    per = inter // tp
    try:  # gate_up_proj (column parallel), then down_proj (row parallel)
        Fp8LinearMethod.validate_block_quant_shapes(
            layer, quant, hidden, hidden, 2 * inter, 2 * per, [per, per]
        )
        Fp8LinearMethod.validate_block_quant_shapes(layer, quant, inter, per, hidden, hidden, [hidden])
    except ValueError as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    sys.exit(main())
