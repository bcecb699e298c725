"""spec.model.kvCacheDtype reaches the engine: the capacity check assumes it, so SGLang must get it."""

from __future__ import annotations

from moe_contract.engine import EngineConfig
from moe_operator.render.engine import engine_config
from moe_runtime.config import PodEnv
from moe_runtime.launcher.args import build_command
from render_cases import gb200_decode_spec


def _argv(kv: str) -> list[str]:
    spec = gb200_decode_spec()
    spec.model.kv_cache_dtype = kv  # type: ignore[assignment]
    cfg = EngineConfig.model_validate(engine_config(spec, "decode"))
    return build_command(cfg, PodEnv(rank=0, nnodes=4, leader_address="l"))


def test_fp8_kv_cache_is_passed_and_auto_is_left_to_sglang() -> None:
    argv = _argv("fp8_e4m3")
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert "--kv-cache-dtype" not in _argv("auto")
