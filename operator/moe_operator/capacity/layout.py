"""How one engine instance splits its GPUs between attention and experts.

An instance spans ``nodes`` nodes of ``gpus_per_node`` GPUs: its world. SGLang runs the
MoE layers over the whole world (EP size = world) and attention as ``attention_dp``
data-parallel groups of ``world / attention_dp`` tensor-parallel GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceLayout:
    """The parallel shape of one engine instance (one pod group)."""

    nodes: int
    gpus_per_node: int
    attention_dp: int
    expert_parallel: bool = True  # False: experts are tensor-parallel (no all-to-all backend)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1 or self.attention_dp < 1:
            raise ValueError(f"layout sizes must be positive: {self}")
        if self.world % self.attention_dp:
            raise ValueError(f"attention_dp {self.attention_dp} does not divide world {self.world}")

    @property
    def world(self) -> int:
        """GPUs in the instance: nodes x GPUs per node (SGLang's --tp-size)."""
        return self.nodes * self.gpus_per_node

    @property
    def attention_tp(self) -> int:
        """GPUs that share one attention computation (tensor parallel)."""
        return self.world // self.attention_dp

    @property
    def ep_size(self) -> int:
        """Expert-parallel degree: the world with an all-to-all backend, else 1."""
        return self.world if self.expert_parallel else 1
