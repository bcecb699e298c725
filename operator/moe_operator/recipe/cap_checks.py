"""DeepEP's low-latency dispatch cap held against every way a rank can dispatch more tokens.

The low-latency kernels' buffer holds ``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` tokens
per rank; DeepEP asserts ``x.size(0) <= num_max_dispatch_tokens_per_rank`` at dispatch (and so
at CUDA-graph capture). A rank dispatches its running requests times the tokens each verifies
(speculative decoding), a decode CUDA graph captures its batch size, and a low-latency pool that
also runs prefill dispatches a whole chunk per rank. SGLang 0.5.23 asserts the cap is at most
1024 in every DeepEP mode (layers/moe/token_dispatcher/deepep.py).
"""

from __future__ import annotations

import json
from typing import Any

from .context import DISPATCH_CAP_ENV, PoolContext
from .derive import DISPATCH_CAP_DEFAULT, DISPATCH_CAP_MAX, batch_per_rank, effective_deepep_mode
from .findings import Finding, as_int, last_value


def cap_findings(ctx: PoolContext, args: list[str], where: str) -> list[Finding]:
    if not ctx.deepep or ctx.layout.ep_size <= 1:
        return []
    cap, out = _cap(ctx)
    if cap is None or not ctx.low_latency:
        return out
    mode = effective_deepep_mode(ctx)
    if ctx.role == "prefill":
        return [*out, _refuse(f"{where}.deepepMode", f"{where}: low_latency kernels cannot carry prefill "
                              f"chunks ({ctx.deepep_mode}); use deepepMode: normal")]  # fmt: skip
    dp = ctx.layout.attention_dp
    draft, problem = _draft_tokens(args, where)
    out += problem
    out += _running(args, where, cap, dp, draft)
    out += _graphs(args, where, cap, draft)
    if ctx.role == "standalone" and mode == "low_latency":
        chunk = as_int(last_value(args, "chunked_prefill_size"))
        if chunk is None or chunk <= 0 or chunk // dp > cap:
            per_rank = "unbounded" if chunk is None or chunk <= 0 else f"{chunk // dp} tokens per rank"
            out.append(_refuse(f"{where}.deepepMode", f"{where}: a pool that also computes prompts dispatches "
                f"whole prefill chunks ({per_rank}) through the low_latency kernels, above the dispatch cap "
                f"{cap}: use deepepMode auto (normal kernels for prefill)"))  # fmt: skip
    return out


def _refuse(field: str, message: str) -> Finding:
    return Finding("refuse", field, message)


def _cap(ctx: PoolContext) -> tuple[int | None, list[Finding]]:
    """The cap the engine runs with, or None (with why) when it cannot be known or is invalid."""
    user = ctx.user_cap
    if user == "ref":
        return None, [Finding("warn", "spec.engine.env", f"{DISPATCH_CAP_ENV} comes from a reference: the "
                              "operator cannot check running requests and CUDA graphs against it")]  # fmt: skip
    if user is None:
        cap = batch_per_rank(ctx) if ctx.low_latency else DISPATCH_CAP_DEFAULT
    elif isinstance(user, int):
        cap = user
    else:
        return None, [_refuse("spec.engine.env", f"{DISPATCH_CAP_ENV}={user!r} is not an integer")]
    if not 1 <= cap <= DISPATCH_CAP_MAX:
        return None, [_refuse("spec.engine.env", f"{DISPATCH_CAP_ENV}={cap}: SGLang asserts 1..{DISPATCH_CAP_MAX} "
                              "(token_dispatcher/deepep.py); lower it and --max-running-requests with it")]  # fmt: skip
    return cap, []


def _draft_tokens(args: list[str], where: str) -> tuple[int, list[Finding]]:
    """Tokens each running request dispatches per step: 1, or the draft tokens speculative decoding verifies."""
    if last_value(args, "speculative_algorithm") is None:
        return 1, []
    draft = as_int(last_value(args, "speculative_num_draft_tokens"))
    if draft is None:
        steps = as_int(last_value(args, "speculative_num_steps"))
        draft = steps + 1 if steps is not None else None
    if draft is None or draft < 1:
        return 1, [_refuse(f"{where}.extraArgs", f"{where}: with speculative decoding set "
                           "--speculative-num-draft-tokens: each request then dispatches that many tokens per "
                           "step, which the DeepEP dispatch cap must hold")]  # fmt: skip
    return draft, []


def _running(args: list[str], where: str, cap: int, dp: int, draft: int) -> list[Finding]:
    mrr = as_int(last_value(args, "max_running_requests"))
    if mrr is None or mrr <= 0:
        return [_refuse(f"{where}.extraArgs", f"{where}: nothing bounds the running requests of a rank under "
                        f"DeepEP's low-latency cap ({cap} tokens per rank): set --max-running-requests to at most "
                        f"{cap // draft * dp} ({cap // draft} per attention-DP rank x {dp})")]  # fmt: skip
    tokens = max(mrr // dp, 1) * draft
    if tokens <= cap:
        return []
    per = f"{mrr // dp} per attention-DP rank" + (f" x {draft} draft tokens" if draft > 1 else "")
    return [_refuse(f"{where}.extraArgs", f"{where}: --max-running-requests {mrr} is {per} = {tokens} tokens, "
                    f"above DeepEP's low-latency dispatch cap {DISPATCH_CAP_ENV}={cap}: a full rank fails DeepEP's "
                    f"assertion. Lower it to {cap // draft * dp} or raise the cap (at most {DISPATCH_CAP_MAX})")]  # fmt: skip


def _graphs(args: list[str], where: str, cap: int, draft: int) -> list[Finding]:
    largest, source = _decode_graph_max(args)
    if largest is None:
        return []
    if largest <= 0:
        return [_refuse(f"{where}.extraArgs", f"{where}: {source} {largest} is not a batch size")]
    if largest * draft <= cap:
        return []
    return [_refuse(f"{where}.extraArgs", f"{where}: {source} captures decode batches of {largest}"
                    + (f" x {draft} draft tokens" if draft > 1 else "")
                    + f", above DeepEP's low-latency dispatch cap {cap}: capture fails. Lower it or raise the cap")]  # fmt: skip


def _decode_graph_max(args: list[str]) -> tuple[int | None, str]:
    """The largest decode CUDA graph as SGLang picks it: --cuda-graph-config's decode section first
    (arg_groups/fields/exec_.py), then --cuda-graph-bs-decode, then --cuda-graph-max-bs-decode."""
    config = last_value(args, "cuda_graph_config")
    if config is not None:
        try:
            decode: Any = (json.loads(config) or {}).get("decode") or {}
            sizes = [int(b) for b in decode.get("bs") or []]
            if "max_bs" in decode or sizes:
                return int(decode.get("max_bs") or max(sizes)), "--cuda-graph-config"
        except (ValueError, TypeError, AttributeError):
            return -1, "--cuda-graph-config (not the JSON SGLang reads)"
    sizes_arg = last_value(args, "cuda_graph_bs_decode", every=True)
    if sizes_arg:
        values = [as_int(v) for v in sizes_arg.split()]
        return (
            max(v for v in values if v is not None) if all(v is not None for v in values) else -1
        ), "--cuda-graph-bs-decode"
    value = last_value(args, "cuda_graph_max_bs_decode")
    return (as_int(value) if value is not None else None), "--cuda-graph-max-bs-decode"
