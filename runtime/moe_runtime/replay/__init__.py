"""GPU-less stand-in for an SGLang engine, for demos and end-to-end tests without GPUs.

It generates routing from a trace model, applies the current placement with the
dispatch rule, calls the same EPLB hook code at SGLang's cadence, exports SGLang's
metric names, and serves the sidecar API.
"""
