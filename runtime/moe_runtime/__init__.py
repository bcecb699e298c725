"""The engine pod's runtime: SGLang launcher, load reporting sidecar, EPLB plugin, replay engine."""

__version__ = "0.1.0"
