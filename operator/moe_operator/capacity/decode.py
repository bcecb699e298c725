"""Floor on the time of one decode step: a small-batch step reads every weight once."""

from __future__ import annotations

H100_HBM_BYTES_PER_S = 3.35e12
H100_BF16_FLOPS = 989e12


def decode_floor_seconds(
    weight_bytes: float, gpus: int, hbm_bytes_per_s: float = H100_HBM_BYTES_PER_S
) -> float:
    """Memory-bound floor of one decode step: N b_w / (p x B_HBM) for weights split over p GPUs."""
    return weight_bytes / (gpus * hbm_bytes_per_s)


def step_seconds(
    bytes_read_per_gpu: float,
    flops_per_gpu: float = 0.0,
    hbm_bytes_per_s: float = H100_HBM_BYTES_PER_S,
    peak_flops: float = H100_BF16_FLOPS,
    communication_s: float = 0.0,
) -> float:
    """Roofline step time: the slower of reading memory and doing arithmetic, plus communication."""
    return max(bytes_read_per_gpu / hbm_bytes_per_s, flops_per_gpu / peak_flops) + communication_s


def moe_decode_floor_seconds(expert_and_dense_bytes_per_gpu: float, hbm_bytes_per_s: float) -> float:
    """Floor of an EP decode step: every GPU reads its own share (its experts + dense part) once."""
    return expert_and_dense_bytes_per_gpu / hbm_bytes_per_s
