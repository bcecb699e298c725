"""The SGLang metrics the replay engine exports, with SGLang's names and labels."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Summary


class SGLangMetrics:
    def __init__(self, registry: CollectorRegistry, *, model_name: str, engine_type: str) -> None:
        self.labels = {
            "model_name": model_name,
            "engine_type": engine_type,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        names = list(self.labels)
        self.eplb_balancedness = Summary(
            "sglang:eplb_balancedness",
            "Balancedness of MoE in expert parallelism.",
            [*names, "forward_mode"],
            registry=registry,
        )
        self.num_running_reqs = Gauge(
            "sglang:num_running_reqs", "The number of running requests.", names, registry=registry
        )
        self.num_queue_reqs = Gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", names, registry=registry
        )
        self.gen_throughput = Gauge(
            "sglang:gen_throughput", "The generation throughput (token/s).", names, registry=registry
        )
        self.token_usage = Gauge("sglang:token_usage", "The token usage.", names, registry=registry)

    def observe_pass(self, balancedness: float, forward_mode: str) -> None:
        self.eplb_balancedness.labels(**self.labels, forward_mode=forward_mode).observe(balancedness)

    def set_load(self, running: int, throughput: float, usage: float) -> None:
        self.num_running_reqs.labels(**self.labels).set(running)
        self.num_queue_reqs.labels(**self.labels).set(0)
        self.gen_throughput.labels(**self.labels).set(throughput)
        self.token_usage.labels(**self.labels).set(usage)
