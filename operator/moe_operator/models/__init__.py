"""Catalog of Mixture-of-Experts model facts (layers, experts, top-k, KV bytes per token)."""

from .architecture import BYTES_PER_ELEMENT, Attention, AttentionKind, Dtype, MoEArchitecture
from .catalog import CATALOG, known_names, lookup

__all__ = [
    "BYTES_PER_ELEMENT",
    "CATALOG",
    "Attention",
    "AttentionKind",
    "Dtype",
    "MoEArchitecture",
    "known_names",
    "lookup",
]
