"""The contract between the operator and the engine pod, imported by both and by nothing else's internals.

``engine``: the per-pool engine config (JSON) the operator renders and the runtime launches
from; ``pod``: the paths, ports and environment variables of an engine pod; ``windows_wire``: the
binary encoding of the runtime's load windows (``GET /v1/windows``); ``plan_wire``: the plan request the
operator sends a runtime that plans its own instance (``PUT /v1/plan``).
"""
