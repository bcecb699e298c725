"""extraArgs that SGLang 0.5.23 (or sglang-router 0.3.2) or the operator must refuse, and ones it
must accept: one table for validate(), `moe-operator crds validate` and the real apiserver's webhook.

Each refused case names the list it goes into, the field its refusal must point at (list and
index) and the texts the message must hold: the flag as written, and the words of the fix.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from .invalid_specs import BASE_SPEC


@dataclass(frozen=True)
class ArgCase:
    name: str
    where: str  # engine, prefill, decode or router
    args: tuple[str, ...]
    field: str = ""  # spec.decode.extraArgs[0]
    texts: tuple[str, ...] = ()


REFUSED: list[ArgCase] = [
    ArgCase("ambiguous-split-flag", "decode", ("--cuda-graph-max-bs", "128"), "spec.decode.extraArgs[0]",
            ("--cuda-graph-max-bs", "ambiguous", "--cuda-graph-max-bs-decode")),
    ArgCase("ambiguous-with-equals", "prefill", ("--cuda-graph-bs=8",), "spec.prefill.extraArgs[0]",
            ("--cuda-graph-bs", "ambiguous", "--cuda-graph-bs-prefill")),
    ArgCase("removed-ep-moe", "engine", ("--enable-ep-moe",), "spec.engine.extraArgs[0]",
            ("--enable-ep-moe", "was removed", "--ep-size")),
    ArgCase("removed-deepep-moe", "prefill", ("--enable-deepep-moe",), "spec.prefill.extraArgs[0]",
            ("--enable-deepep-moe", "spec.prefill.allToAllBackend")),
    ArgCase("unknown-with-suggestion", "decode", ("--chunk-prefill-size", "8192"), "spec.decode.extraArgs[0]",
            ("--chunk-prefill-size", "did you mean --chunked-prefill-size")),
    ArgCase("owned-prefix-tp", "engine", ("--tp", "8"), "spec.engine.extraArgs[0]",
            ("--tp (an abbreviation of --tp-size)", "nodesPerReplica")),
    ArgCase("owned-alias-ep-equals", "decode", ("--ep=72",), "spec.decode.extraArgs[0]",
            ("--ep (an alias of --ep-size)", "spec.decode.nodesPerReplica")),
    ArgCase("owned-alias-model", "engine", ("--model", "/models/other"), "spec.engine.extraArgs[0]",
            ("--model (an alias of --model-path)", "spec.model.path")),
    ArgCase("owned-alias-attention-dp", "decode", ("--attention-data-parallel-size", "72"),
            "spec.decode.extraArgs[0]", ("--attention-data-parallel-size", "spec.decode.attentionDataParallel")),
    ArgCase("owned-prefix-bootstrap", "prefill", ("--disaggregation-b", "9000"), "spec.prefill.extraArgs[0]",
            ("--disaggregation-b (an abbreviation of --disaggregation-bootstrap-port)",
             "spec.kvTransfer.bootstrapPort")),
    ArgCase("owned-deprecated-dp-attention", "decode", ("--enable-dp-attention",), "spec.decode.extraArgs[0]",
            ("--enable-dp-attention", "spec.decode.attentionDataParallel")),
    ArgCase("lifted-flag-abbreviated", "engine", ("--trust-remote",), "spec.engine.extraArgs[0]",
            ("--trust-remote", "write --trust-remote-code in full")),
    ArgCase("wrong-type-float", "engine", ("--mem-fraction-static", "high"), "spec.engine.extraArgs[0]",
            ("--mem-fraction-static", "invalid float value: 'high'")),
    ArgCase("wrong-type-int", "decode", ("--max-running-requests=many",), "spec.decode.extraArgs[0]",
            ("--max-running-requests", "invalid int value")),
    ArgCase("outside-choices", "engine", ("--load-balance-method", "fastest"), "spec.engine.extraArgs[0]",
            ("--load-balance-method", "invalid choice: 'fastest'", "round_robin")),
    ArgCase("int-not-human-readable", "prefill", ("--chunked-prefill-size", "16k"), "spec.prefill.extraArgs[0]",
            ("--chunked-prefill-size", "invalid int value: '16k'")),
    ArgCase("missing-value", "decode", ("--max-running-requests",), "spec.decode.extraArgs[0]",
            ("--max-running-requests", "needs a value")),
    ArgCase("store-true-with-equals-value", "decode", ("--enable-two-batch-overlap=true",),
            "spec.decode.extraArgs[0]", ("--enable-two-batch-overlap", "takes no value")),
    ArgCase("store-true-then-value", "decode", ("--enable-two-batch-overlap", "true"), "spec.decode.extraArgs[1]",
            ("'true'", "--enable-two-batch-overlap, which takes no value")),
    ArgCase("value-without-flag", "engine", ("8192",), "spec.engine.extraArgs[0]",
            ("'8192'", "not a flag")),
    ArgCase("eplb-algorithm-checked-late", "engine", ("--eplb-algorithm", "deepseek_v3"), "spec.engine.extraArgs[0]",
            ("--eplb-algorithm", "'deepseek_v3'", "deepseek_hierarchical", "first rebalance")),
    ArgCase("rebalance-threshold-below-one", "engine", ("--eplb-min-rebalancing-utilization-threshold", "0.8"),
            "spec.engine.extraArgs[0]", ("--eplb-min-rebalancing-utilization-threshold", "bypasses")),
    ArgCase("elastic-ep", "decode", ("--elastic-ep-backend", "mooncake"), "spec.decode.extraArgs[0]",
            ("--elastic-ep-backend", "elastic EP")),
    ArgCase("elastic-ep-max-size", "decode", ("--max-ep-size=144",), "spec.decode.extraArgs[0]",
            ("--max-ep-size", "elastic EP")),
    ArgCase("dwdp", "prefill", ("--dwdp-size", "32"), "spec.prefill.extraArgs[0]", ("--dwdp-size", "DWDP")),
    ArgCase("recorder-buffer", "decode", ("--expert-distribution-recorder-buffer-size", "-1"),
            "spec.decode.extraArgs[0]", ("--expert-distribution-recorder-buffer-size", "load window")),
    ArgCase("config-file", "engine", ("--config", "/etc/sglang.yaml"), "spec.engine.extraArgs[0]",
            ("--config", "admission cannot check")),
    ArgCase("help-exits", "prefill", ("--help",), "spec.prefill.extraArgs[0]", ("--help", "exit")),
    ArgCase("router-owned-timeout", "router", ("--worker-startup-timeout-secs", "60"), "spec.router.extraArgs[0]",
            ("--worker-startup-timeout-secs", "spec.engine.startupTimeout")),
    ArgCase("router-owned-policy-equals", "router", ("--policy=random",), "spec.router.extraArgs[0]",
            ("--policy", "spec.router.policy")),
    ArgCase("router-control-plane-keys", "router", ("--control-plane-api-keys", "me:me:admin:hunter2"),
            "spec.router.extraArgs[0]", ("--control-plane-api-keys", "locks the router's worker-management API")),
    ArgCase("router-mini-lb", "router", ("--mini-lb",), "spec.router.extraArgs[0]",
            ("--mini-lb", "no control-plane authentication")),
    ArgCase("router-unknown", "router", ("--max-concurent-requests", "8"), "spec.router.extraArgs[0]",
            ("--max-concurent-requests", "sglang-router 0.3.2", "did you mean --max-concurrent-requests")),
    ArgCase("router-choice", "router", ("--decode-policy", "fastest"), "spec.router.extraArgs[0]",
            ("--decode-policy", "invalid choice: 'fastest'")),
    ArgCase("router-negative-shutdown-grace", "router", ("--shutdown-grace-period-secs", "-5"),
            "spec.router.extraArgs[0]", ("--shutdown-grace-period-secs -5", "unsigned", "give 0 or more")),
    ArgCase("router-shutdown-grace-past-timeout", "router", ("--shutdown-grace=9223372036854775807",),
            "spec.router.extraArgs[0]", ("an abbreviation of --shutdown-grace-period-secs", "request timeout (1800 s",
                                         "give at most 1800")),
    ArgCase("router-shutdown-grace-past-a-day", "router",
            ("--request-timeout-secs", "200000", "--shutdown-grace-period-secs", "100000"),
            "spec.router.extraArgs[2]", ("at most 86400 s here", "give at most 86400")),
    ArgCase("router-prefill-power-of-two", "router", ("--prefill-policy=power_of_two",), "spec.router.extraArgs[0]",
            ("power_of_two", "fewer than two prefill instances", "set spec.router.policy: power_of_two instead")),
    # the router hands its integers to Rust fields (u16, u32, u64, i32), bounds probed on 0.3.2
    ArgCase("router-negative-retries", "router", ("--retry-max-retries", "-1"), "spec.router.extraArgs[0]",
            ("--retry-max-retries -1", "sglang-router 0.3.2 takes 0 to 4294967295", "stops at start-up")),
    ArgCase("router-retries-past-u32", "router", ("--retry-max-retries=4294967296",), "spec.router.extraArgs[0]",
            ("takes 0 to 4294967295",)),
    ArgCase("router-threshold-past-u32", "router", ("--cb-failure-threshold", "99999999999"),
            "spec.router.extraArgs[0]", ("--cb-failure-threshold 99999999999", "takes 0 to 4294967295")),
    ArgCase("router-negative-queue", "router", ("--queue-size", "-3"), "spec.router.extraArgs[0]",
            ("--queue-size -3", "takes 0 to 18446744073709551615")),
]  # fmt: skip

ACCEPTED: list[ArgCase] = [
    ArgCase("split-flag-decode", "decode", ("--cuda-graph-max-bs-decode", "128")),
    ArgCase("two-batch-overlap", "decode", ("--enable-two-batch-overlap",)),
    ArgCase("both-together", "decode", ("--cuda-graph-max-bs-decode=128", "--enable-two-batch-overlap")),
    ArgCase("chunked-prefill", "prefill", ("--chunked-prefill-size", "16384")),
    ArgCase("human-readable-int", "prefill", ("--max-prefill-tokens", "16k", "--context-length=32Ki")),
    ArgCase("unique-abbreviation", "decode", ("--cuda-graph-max-bs-d", "64")),
    ArgCase("lifted-flags", "engine", ("--trust-remote-code", "--load-format=dummy", "--mem-fraction-static", "0.85")),
    ArgCase("eplb-algorithm-known", "engine", ("--eplb-algorithm", "deepseek_hierarchical")),
    ArgCase("rebalance-threshold-default", "engine", ("--eplb-min-rebalancing-utilization-threshold", "1.0")),
    ArgCase("negative-number-value", "engine", ("--schedule-conservativeness", "-0.5")),
    ArgCase("deprecated-but-working", "decode", ("--disable-cuda-graph",)),
    ArgCase("router-tuning", "router", ("--prefill-policy", "bucket", "--max-concurrent-requests", "256")),
    ArgCase("router-longer-shutdown-grace", "router", ("--request-timeout-secs", "3600", "--shutdown-grace-period-secs", "3600")),
    # two decode replicas, not autoscaled: the list always holds two (an existing spec keeps reconciling)
    ArgCase("router-decode-power-of-two-fixed-pool", "router", ("--decode-policy", "power_of_two")),
    ArgCase("router-signed-limit", "router", ("--max-concurrent-requests", "-1", "--retry-max-retries", "4294967295")),
]  # fmt: skip


def spec_with(case: ArgCase) -> dict[str, Any]:
    """BASE_SPEC (P/D DeepSeek-V3 on H100) with the case's list set; engine keeps --trust-remote-code."""
    spec = copy.deepcopy(BASE_SPEC)
    section = spec[case.where]
    section["extraArgs"] = list(case.args)
    return spec
