"""SGLang 0.5.23's Prometheus metrics, read from the installed wheel (run with .venv-runtime).

    .venv-runtime/bin/python tools/sglang_metrics.py generate   # writes the catalog
    .venv-runtime/bin/python tools/sglang_metrics.py check      # exit 1 when it drifted

The catalog (policies/prometheus/sglang-0.5.23.metrics.yaml) is what "shaped exactly as
SGLang exports them" means for the alert rules, their promtool tests and the replay engine:
every ``sglang:*`` family the engine's HTTP ``/metrics`` can serve under the command lines
the operator launches, with type, label names, histogram buckets (``le`` as exported), the
process that writes it and the variants in which it exists; plus the real ``/metrics`` text
of a small, fixed set of observations.

How: SGLang serves ``/metrics`` in prometheus_client multiprocess mode (every process writes
mmap files under PROMETHEUS_MULTIPROC_DIR; ``add_prometheus_middleware`` reads them). This
script does the same with SGLang's own code: per variant it parses the command line with
``ServerArgs.add_cli_args``, forks one process per SGLang process (tokenizer, schedulers with
their real rank arithmetic), builds SGLang's collectors there (``TokenizerMetricsCollector``
with ``tokenizer_metric_labels()``, ``SchedulerMetricsCollector.init_new``, ...) and calls their
real observe/log methods, then serves the directory through SGLang's ``add_prometheus_middleware``
and GETs ``/metrics``. Faked, because the CPU test env cannot publish a real runtime context
(that needs transformers and torchvision): the context accessors, which return the parsed
command line (as tests/runtime/sglang_ctx.py does for EPLB), and two enums whose modules
import transformers (compiled from the wheel's own source text).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import multiprocessing
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.5.23"
CATALOG = REPO / "policies" / "prometheus" / f"sglang-{VERSION}.metrics.yaml"

# Variants: the engine flags the launcher passes (runtime/moe_runtime/launcher/args.py), trimmed
# to what changes metrics. Processes: what one SGLang server runs on its first node.
BASE = ["--model-path", "/models/m", "--served-model-name", "m", "--enable-metrics"]
VARIANTS: dict[str, dict[str, Any]] = {
    "ep": {
        "about": "EP 8, standalone, balancedness report mode prometheus",
        "argv": [*BASE, "--tp-size", "8", "--ep-size", "8", "--expert-balancedness-report-mode", "prometheus"],
        "schedulers": [0, 1],
    },
    "attention-dp": {
        "about": "EP 8 with attention DP 8, P/D decode, report mode prometheus",
        "argv": [
            *BASE, "--tp-size", "8", "--ep-size", "8", "--attn-dp-size", "8",
            "--disaggregation-mode", "decode", "--expert-balancedness-report-mode", "prometheus",
        ],
        "schedulers": [0, 1],
    },
    "plain": {
        "about": "TP 1 without EP, P/D prefill, report mode off as the launcher sets it without EP",
        "argv": [*BASE, "--disaggregation-mode", "prefill"],
        "schedulers": [0],
    },
}  # fmt: skip
EXPOSITION_VARIANT = "attention-dp"

# Modules metrics_collector imports only for an enum, whose own imports need transformers.
_ENUM_MODULES = {
    "sglang.srt.disaggregation.utils": ("DisaggregationMode",),
    "sglang.srt.model_executor.forward_batch_info": ("ForwardMode",),
}
# Context fields that are no command-line flag (set by code at publish).
_NOT_FLAGS = {"stat_loggers": None}


# ------------------------------------------------------------------ loading SGLang's code on CPU


def _enum_module(name: str, classes: tuple[str, ...]) -> types.ModuleType:
    """A module holding only ``classes``, compiled from the real module's source."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, name
    tree = ast.parse(Path(spec.origin).read_text())
    body = ast.parse("from enum import Enum, IntEnum, auto\nfrom typing import Optional").body
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in classes]
    assert [n.name for n in found] == list(classes), f"{name}: classes {classes} not found"
    module = types.ModuleType(name)
    module.__file__ = spec.origin
    code = compile(ast.Module(body=[*body, *found], type_ignores=[]), spec.origin, "exec")
    exec(code, module.__dict__)
    return module


def load_collectors() -> types.ModuleType:
    """sglang.srt.observability.metrics_collector, importable without transformers."""
    for name, classes in _ENUM_MODULES.items():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            sys.modules[name] = _enum_module(name, classes)
    return importlib.import_module("sglang.srt.observability.metrics_collector")


class _Bag:
    """One runtime-context namespace, read from the parsed command line."""

    def __init__(self, ns: argparse.Namespace) -> None:
        self._ns = ns

    def __getattr__(self, name: str) -> Any:
        if name == "moe":  # get_exec().moe.<flag>
            return self
        if name in _NOT_FLAGS:
            return _NOT_FLAGS[name]
        return getattr(self._ns, name)  # AttributeError: SGLang reads a context field we do not know


def parse(argv: list[str]) -> argparse.Namespace:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)
    if ns.served_model_name is None:  # as ServerArgs.__post_init__ does
        ns.served_model_name = ns.model_path
    return ns


def scheduler_ranks(ns: argparse.Namespace, tp_rank: int) -> types.SimpleNamespace:
    """The ranks SGLang gives the scheduler of ``tp_rank`` (its own rank arithmetic)."""
    from sglang.srt.runtime_context import derive_attention_ranks, derive_attn_tp_size, derive_spawn_ranks

    attn_dp = ns.attn_dp_size or 1
    attn_tp_size = derive_attn_tp_size(tp_size=ns.tp_size, attn_cp_size=1, attn_dp_size=attn_dp)
    attn_tp_rank, attn_dp_rank = derive_attention_ranks(
        tp_rank=tp_rank, attn_tp_size=attn_tp_size, attn_cp_size=1
    )
    spawn = derive_spawn_ranks(
        world_rank=tp_rank,
        tp_size=ns.tp_size,
        ep_join_rank_offset=0,
        attn_cp_size=1,
        attn_tp_size=attn_tp_size,
        moe_dp_size=1,
        moe_ep_size=ns.ep_size,
    )
    return types.SimpleNamespace(
        tp_rank=spawn["tp_rank"],
        pp_rank=spawn["pp_rank"],
        moe_ep_rank=spawn["moe_ep_rank"],
        attn_tp_rank=attn_tp_rank,
        attn_cp_rank=spawn["attn_cp_rank"],
        attn_dp_rank=attn_dp_rank,
        # The DP controller launches each attention-DP group's schedulers with its dp rank
        # (data_parallel_controller: compute_dp_attention_world_info); without DP it is None.
        dp_rank=attn_dp_rank if attn_dp > 1 else None,
    )


@contextmanager
def context(mc: types.ModuleType, ns: argparse.Namespace, parallel: Any) -> Iterator[None]:
    """Point SGLang's context accessors (metrics_collector's and runtime_context's) at ``ns``."""
    from sglang.srt import runtime_context as rc

    bag = _Bag(ns)
    published = types.SimpleNamespace(is_config_namespace_published=lambda name: False)
    fakes: dict[str, Any] = {
        "get_observability": lambda: bag,
        "get_serving": lambda: bag,
        "get_disagg": lambda: bag,
        "get_schedule": lambda: bag,
        "get_exec": lambda: bag,
        "get_parallel": lambda: parallel,
        "get_context": lambda: published,
    }
    saved = [(m, k, getattr(m, k)) for m in (mc, rc) for k in fakes if hasattr(m, k)]
    for module, key, _ in saved:
        setattr(module, key, fakes[key])
    try:
        yield
    finally:
        for module, key, value in saved:
            setattr(module, key, value)


# ------------------------------------------------------------------ the processes of one server


def _families() -> list[dict[str, Any]]:
    """Every sglang:* metric object this process registered, as the catalog records it."""
    from prometheus_client import REGISTRY
    from prometheus_client.utils import floatToGoString

    out = []
    seen: set[int] = set()
    collector: Any  # prometheus_client metric objects: their private fields hold what the catalog records
    for collector in list(REGISTRY._collector_to_names):
        name = getattr(collector, "_name", "")
        if not name.startswith("sglang:") or id(collector) in seen:
            continue
        seen.add(id(collector))
        kind = collector._type
        labels = list(collector._labelnames)
        mode = getattr(collector, "_multiprocess_mode", "")
        if kind == "gauge" and mode in ("all", "liveall"):
            labels.append("pid")  # MultiProcessCollector keeps the writer's pid on these
        entry: dict[str, Any] = {
            "name": name,
            "type": kind,
            "help": collector._documentation,
            "labels": labels,
        }
        if kind == "histogram":
            entry["buckets"] = [str(floatToGoString(b)) for b in collector._upper_bounds]  # type: ignore[no-untyped-call]
        if kind == "gauge":
            entry["multiprocess_mode"] = mode
        out.append(entry)
    return out


def _tokenizer(mc: types.ModuleType, ns: argparse.Namespace) -> list[dict[str, Any]]:
    """The HTTP server process: TokenizerManager's collector, the HTTP and function-timer metrics."""
    from sglang.srt.observability import cpu_monitor, func_timer, http_request_metrics

    with context(mc, ns, types.SimpleNamespace()):
        labels = mc.tokenizer_metric_labels()
        collector = mc.TokenizerMetricsCollector(
            server_args=None,
            labels=labels,
            bucket_time_to_first_token=ns.bucket_time_to_first_token,
            bucket_e2e_request_latency=ns.bucket_e2e_request_latency,
            bucket_inter_token_latency=ns.bucket_inter_token_latency,
        )
        func_timer.enable_func_timer()
        http_request_metrics.init_http_request_metrics()
        cpu_monitor.start_cpu_monitor_thread("tokenizer", interval=3600)
        # A fixed set of observations, through SGLang's own methods (TokenizerManager.collect_metrics).
        base = dict(collector.labels)
        collector.observe_time_to_first_token(base, 0.3, stream=True)
        collector.observe_time_to_first_token(base, 3.0, stream=False)
        collector.observe_inter_token_latency(base, 0.09, 3)
        collector.observe_one_finished_request(
            base, 100, 20, 0, 2.5, False, is_streaming=True, time_per_output_token=0.05
        )
    return _families()


def _scheduler(mc: types.ModuleType, ns: argparse.Namespace, tp_rank: int) -> list[dict[str, Any]]:
    """One scheduler process (Scheduler: SchedulerMetricsCollector.init_new, the EPLB recorder's collector)."""
    from sglang.srt import runtime_context as rc

    parallel = scheduler_ranks(ns, tp_rank)
    with context(mc, ns, parallel):
        ctx = mc.SchedulerMetricsCollector.init_new(
            server_args=None,
            enable_priority_scheduling=ns.enable_priority_scheduling,
            enable_lora=False,
            enable_hierarchical_cache=False,
        )
        collector = ctx.collector
        if rc.reports_expert_balancedness():
            mc.ExpertDispatchCollector(ns.ep_size)  # every rank's recorder builds one
        if ctx.current_scheduler_metrics_enabled:  # stats-logging rank: attention-TP rank 0
            collector.log_stats(mc.SchedulerStats())
        collector.emit_constants(
            max_total_num_tokens=1000,
            max_total_num_tokens_swa=None,
            weight_memory_usage_gb=1.0,
            kv_cache_memory_usage_gb=1.0,
            graph_memory_usage_gb={},
            max_running_requests_under_SLO=None,
            page_size=1,
            num_pages=1000,
            context_len=4096,
            startup_available_gpu_memory_gb=80.0,
        )
        if hasattr(collector, "eplb_balancedness"):
            collector.increment_eplb_balancedness(forward_mode="decode", balancedness=0.6)
    return _families()


def _child(
    mc: types.ModuleType, ns: argparse.Namespace, role: str, tp_rank: int, directory: str, conn: Any
) -> None:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # prometheus_client opens its files lazily
    try:
        result = _tokenizer(mc, ns) if role == "tokenizer" else _scheduler(mc, ns, tp_rank)
        conn.send(("ok", result))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def run_variant(mc: types.ModuleType, variant: str, directory: str) -> dict[str, Any]:
    """Fork the variant's processes (each writes to ``directory``), then GET SGLang's /metrics."""
    fork = multiprocessing.get_context("fork")
    ns = parse(VARIANTS[variant]["argv"])
    processes: list[tuple[str, dict[str, Any]]] = []
    jobs = [("tokenizer", 0)] + [("scheduler", r) for r in VARIANTS[variant]["schedulers"]]
    for role, rank in jobs:
        parent, child = fork.Pipe()
        proc = fork.Process(target=_child, args=(mc, ns, role, rank, directory, child))
        proc.start()
        status, payload = parent.recv()
        proc.join()
        if status != "ok":
            raise SystemExit(f"{variant} {role} {rank}: {payload}")
        processes.append((f"{role}" if role == "tokenizer" else f"scheduler tp_rank={rank}", payload))
    return {"processes": processes, "exposition": scrape(directory)}


def scrape(directory: str) -> str:
    """GET /metrics from a Starlette app with SGLang's own add_prometheus_middleware."""
    from sglang.srt.utils.common import add_prometheus_middleware
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    app = Starlette()
    add_prometheus_middleware(app)
    response = TestClient(app).get("/metrics")
    assert response.status_code == 200, response.text
    return str(response.text)


# ------------------------------------------------------------------ the catalog


# The series of the exposition excerpt: what the alert rules, docs/alerts.md and the replay engine read.
EXCERPT = (
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds",
    "sglang:request_time_per_output_token_seconds",
    "sglang:num_requests",
    "sglang:prompt_tokens",
    "sglang:generation_tokens",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:gen_throughput",
    "sglang:token_usage",
    "sglang:max_total_num_tokens",
    "sglang:eplb_balancedness",
)
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_count", "_sum"),
}


def excerpt(text: str) -> str:
    """The EXCERPT families of a /metrics text, with pids blanked and samples sorted (stable)."""
    import re

    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in sorted(text_string_to_metric_families(text), key=lambda f: f.name):
        if family.name not in EXCERPT:
            continue
        out.append(f"# TYPE {family.name} {family.type}")
        lines = []
        for s in family.samples:
            labels = {k: ("<pid>" if k == "pid" else v) for k, v in s.labels.items()}
            body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            lines.append(f"{s.name}{{{body}}} {s.value!r}")
        out += sorted(set(lines), key=lambda line: (re.sub(r'le="[^"]*"', "", line), _le_key(line)))
    return "\n".join(out) + "\n"


def _le_key(line: str) -> float:
    import re

    m = re.search(r'le="([^"]*)"', line)
    return float(m.group(1)) if m else -1.0


def build() -> dict[str, Any]:
    """The catalog; call before anything imports prometheus_client (it picks multiprocess mode then)."""
    base = tempfile.mkdtemp(prefix="sglang-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = base
    assert "prometheus_client" not in sys.modules, (
        "prometheus_client imported before multiprocess mode was set"
    )
    mc = load_collectors()
    seen: dict[str, dict[str, Any]] = {}  # family -> variant -> (entry, processes)
    variants: dict[str, Any] = {}
    text = ""
    for variant, spec in VARIANTS.items():
        with tempfile.TemporaryDirectory(dir=base) as d:
            got = run_variant(mc, variant, d)
        variants[variant] = {"about": spec["about"], "argv": spec["argv"]}
        if variant == EXPOSITION_VARIANT:
            text = excerpt(got["exposition"])
        for process, entries in got["processes"]:
            for entry in entries:
                per = seen.setdefault(entry["name"], {}).setdefault(
                    variant, {"entry": entry, "processes": []}
                )
                if per["entry"] != entry:
                    raise SystemExit(f"{entry['name']}: shape differs between processes of {variant}")
                per["processes"].append(process)
    families = []
    for name in sorted(seen):
        per = seen[name]
        first = next(iter(per.values()))
        entry = first["entry"]
        kind = entry["type"]
        rec: dict[str, Any] = {
            "name": name,
            "type": kind,
            "series": [name + s for s in _SUFFIXES[kind]],
            "help": entry["help"],
            "process": "tokenizer" if first["processes"] == ["tokenizer"] else "scheduler",
            "labels": entry["labels"],
        }
        for key in ("buckets", "multiprocess_mode"):
            if key in entry:
                rec[key] = entry[key]
        if set(per) != set(VARIANTS):
            rec["variants"] = [v for v in VARIANTS if v in per]
        differs = {v: p["entry"]["labels"] for v, p in per.items() if p["entry"]["labels"] != entry["labels"]}
        if differs:
            rec["labels_by_variant"] = differs
        buckets = {
            v: p["entry"]["buckets"]
            for v, p in per.items()
            if p["entry"].get("buckets") != entry.get("buckets")
        }
        if buckets:
            rec["buckets_by_variant"] = buckets
        if rec["process"] == "scheduler" and all(
            p["processes"] == ["scheduler tp_rank=0"]
            for v, p in per.items()
            if len(VARIANTS[v]["schedulers"]) > 1
        ):
            rec["first_rank_only"] = True
        families.append(rec)
    return {
        "sglang": VERSION,
        "variants": variants,
        "families": families,
        "exposition": {"variant": EXPOSITION_VARIANT, "text": text},
    }


HEADER = f"""\
# SGLang {VERSION}'s Prometheus metrics (HTTP /metrics with --enable-metrics), read from the wheel.
# GENERATED by `.venv-runtime/bin/python tools/sglang_metrics.py generate`: do not edit.
# tests/runtime/test_sglang_metrics_catalog.py fails when the installed wheel disagrees.
#
# families: every sglang:* family the variants' processes register. Per variant ("where"): the
#   label names as /metrics exports them (multiprocess mode; `pid` where SGLang's gauge mode keeps
#   it) and the processes that write it. A family absent from a variant does not exist there.
#   Histogram buckets are `le` values as exported ("+Inf" implied). process: tokenizer = the
#   HTTP server of the instance (its first node, the leader pod); scheduler = each scheduler
#   process (worker pods serve theirs on their placeholder /metrics, same port).
#   Families behind flags the operator never sets (--enable-lora, --enable-hierarchical-cache,
#   --enable-streaming-session, encoder disaggregation) are not recorded.
# Code facts the collectors alone do not show (sglang/srt/managers/tokenizer_manager.py,
#   collect_metrics): P/D prefill servers never observe time_to_first_token nor
#   inter_token_latency (only decode and standalone servers do); num_requests_total counts
#   finished requests on every server. Scheduler gauges are written by stats-logging ranks only
#   (attention-TP rank 0 of each attention-DP group), every 30 s while idle.
# --expert-balancedness-report-mode (metrics_reporter.py, expert_distribution.py): prometheus or
#   both adds sglang:eplb_balancedness (observed once per forward pass with EPLB metrics, on the
#   first scheduler; forward_mode is ForwardMode's name lowercased: extend, decode, mixed, idle,
#   ...); any mode but off registers sglang:eplb_gpu_physical_count on every rank (buckets
#   0 .. ep_size-1, here ep_size 8), observed only with SGLANG_EPLB_HEATMAP_COLLECTION_INTERVAL > 0.
# exposition: the real /metrics text of the {EXPOSITION_VARIANT} variant after a fixed set of observations.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.Node:
    flat = all(isinstance(v, str | int | float) for v in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flat)


_Dumper.add_representer(str, _str)
_Dumper.add_representer(list, _list)


def render(catalog: dict[str, Any]) -> str:
    return HEADER + yaml.dump(catalog, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["generate", "check", "print"])
    args = parser.parse_args(argv)
    text = render(build())
    if args.command == "print":
        sys.stdout.write(text)
    elif args.command == "generate":
        CATALOG.write_text(text)
        print(f"wrote {CATALOG.relative_to(REPO)}")
    elif CATALOG.read_text() != text:
        print(f"{CATALOG.relative_to(REPO)} drifted from the installed sglang: run generate and review")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
