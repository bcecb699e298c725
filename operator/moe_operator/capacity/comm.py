"""What messages between GPUs cost: the alpha-beta model, all-reduce and EP all-to-all.

Every message costs a fixed alpha (seconds) plus its size over the bandwidth beta
(bytes per second). Small messages are all alpha; large ones are all beta.
"""

from __future__ import annotations


def alpha_beta_seconds(message_bytes: float, alpha_s: float, beta_bytes_per_s: float) -> float:
    """One message: alpha + n / beta."""
    return alpha_s + message_bytes / beta_bytes_per_s


def ring_allreduce_seconds(message_bytes: float, gpus: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Ring all-reduce: 2(p-1) steps, each moving n/p bytes: 2(p-1) alpha + 2(p-1)/p x n/beta."""
    steps = 2 * (gpus - 1)
    return steps * alpha_s + steps / gpus * message_bytes / beta_bytes_per_s


def two_step_allreduce_seconds(
    message_bytes: float, gpus: int, alpha_s: float, beta_bytes_per_s: float
) -> float:
    """One-hop reduce-scatter plus all-gather over a switch: 2 alpha + 2(p-1)/p x n/beta."""
    return 2 * alpha_s + 2 * (gpus - 1) / gpus * message_bytes / beta_bytes_per_s


def ring_allreduce_bytes_factor(gpus: int) -> float:
    """Bytes each GPU sends in a ring all-reduce, as a multiple of the vector: 2(p-1)/p."""
    return 2 * (gpus - 1) / gpus


def tp_allreduce_bytes_per_step(
    layers: int, hidden: int, tokens: int, bytes_per_element: float, allreduces_per_layer: int = 2
) -> float:
    """Bytes all-reduced per decode step under TP: (A x L) all-reduces of tokens x d x s bytes."""
    return allreduces_per_layer * layers * tokens * hidden * bytes_per_element


def dispatch_bytes(tokens: int, top_k: int, hidden: int, bytes_per_element: float = 1.0) -> float:
    """EP dispatch: every token goes once to each chosen expert: tokens x k x d x s_dispatch."""
    return tokens * top_k * hidden * bytes_per_element


def combine_bytes(tokens: int, top_k: int, hidden: int, bytes_per_element: float = 2.0) -> float:
    """EP combine: each expert's output comes back the same way: tokens x k x d x s_combine."""
    return tokens * top_k * hidden * bytes_per_element


def ep_bytes_per_token_per_layer(
    top_k: int, hidden: int, dispatch_bytes_per_element: float = 1.0, combine_bytes_per_element: float = 2.0
) -> float:
    """Dispatch plus combine for one token in one MoE layer: k x d x (s_dispatch + s_combine)."""
    return top_k * hidden * (dispatch_bytes_per_element + combine_bytes_per_element)


def ep_layer_seconds(
    tokens: int,
    top_k: int,
    hidden: int,
    dispatch_beta: float,
    combine_beta: float,
    alpha_s: float = 0.0,
    dispatch_bytes_per_element: float = 1.0,
    combine_bytes_per_element: float = 2.0,
) -> float:
    """Alpha-beta time of one MoE layer's dispatch and combine for ``tokens`` tokens on one GPU."""
    out = alpha_beta_seconds(
        dispatch_bytes(tokens, top_k, hidden, dispatch_bytes_per_element), alpha_s, dispatch_beta
    )
    back = alpha_beta_seconds(
        combine_bytes(tokens, top_k, hidden, combine_bytes_per_element), alpha_s, combine_beta
    )
    return out + back


def ep_step_seconds(moe_layers: int, per_layer_s: float) -> float:
    """Communication of a whole decode step when nothing hides it: layers x (dispatch + combine)."""
    return moe_layers * per_layer_s


def tokens_per_expert(tokens: int, top_k: int, experts: int) -> float:
    """Average tokens an expert sees in one step: B x k / E (below 1, expert GEMMs become GEMVs)."""
    return tokens * top_k / experts
