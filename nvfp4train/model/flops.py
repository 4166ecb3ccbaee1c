"""Training FLOPs per token for the hybrid family: one formula for all three block types.

Counts 2 FLOPs per multiply-accumulate of every matrix product the model runs: linear layers,
the LM head, the depthwise conv1d, the SSD scan's batched matmuls and attention's QK^T and
PV. Elementwise work (norms, activations, softmax, decays, RoPE) is not counted, the same
convention as `torch.utils.flop_counter` and Megatron's throughput formula. Training =
forward + backward = 3 x forward (the backward of a matmul is two matmuls of the same size).

`causal=True` (the default, for MFU) counts only the useful half of causal products: attention
scores and PV over T/2 keys on average, and the SSD's intra-chunk (Q x Q) and inter-chunk
(chunks x chunks) triangular products at half. `causal=False` counts the full products as the
kernels compute them; that is what `torch.utils.flop_counter` reports for the reference
implementation, and the tests check it to the FLOP.

SSD with chunk length Q, d_inner = heads * head_dim, N = state, G = groups, per token:
    C B^T per group           2 Q N G
    intra-chunk scores @ x    2 Q d_inner
    chunk states  B^T x       2 N d_inner
    carry across chunks       2 (T/Q^2) N d_inner    (2 c^2 N d_inner per sequence of c chunks)
    incoming state  C S       2 N d_inner
(The sequence is padded to a multiple of Q = min(mamba_chunk, T); padded tokens are counted
because they are computed. With a single chunk only the first two terms exist.)
"""

from __future__ import annotations

from .config import ModelConfig


def _mamba_forward(cfg: ModelConfig, seq_len: int, causal: bool) -> float:
    d, di, n, g = cfg.d_model, cfg.mamba_d_inner, cfg.mamba_state, cfg.mamba_groups
    linears = 2 * d * cfg.mamba_in_proj_dim + 2 * di * d
    conv = 2 * cfg.mamba_conv_dim * cfg.mamba_conv
    Q = min(cfg.mamba_chunk, seq_len)
    n_chunks = -(-seq_len // Q)
    tri = 0.5 if causal else 1.0
    per_padded_token = tri * 2 * Q * n * g + tri * 2 * Q * di  # C B^T, scores @ x
    if n_chunks > 1:  # a single chunk has no past state (ssd.py skips these products)
        per_padded_token += (
            2 * n * di  # chunk states
            + tri * 2 * (n_chunks / Q) * n * di  # carry across chunks: 2 c^2 N d_inner per sequence
            + 2 * n * di  # incoming state
        )
    ssd = per_padded_token * (n_chunks * Q) / seq_len
    return linears + conv + ssd


def _attention_forward(cfg: ModelConfig, seq_len: int, causal: bool) -> float:
    d, H, KV, hd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    linears = 2 * d * (H + 2 * KV) * hd + 2 * H * hd * d
    keys = seq_len / 2 if causal else seq_len  # keys each query attends to, on average
    scores_and_pv = 2 * 2 * keys * H * hd
    return linears + scores_and_pv


def _mlp_forward(cfg: ModelConfig) -> float:
    return 2 * 2 * cfg.d_model * cfg.ffn_hidden


def flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = True) -> dict:
    """Training FLOPs per token (fwd + bwd) at sequence length `seq_len`.

    Returns {"total", "mamba", "attention", "mlp", "lm_head"}: the last four are summed over
    all blocks of that type and add up to "total"; plus "forward" (= total / 3) and
    "per_block" ({"M": ..., "*": ..., "-": ...}, one block of each kind)."""
    if seq_len <= 0:
        raise ValueError(f"seq_len: must be a positive integer, got {seq_len}")
    per_block = {
        "M": 3 * _mamba_forward(cfg, seq_len, causal),
        "*": 3 * _attention_forward(cfg, seq_len, causal),
        "-": 3 * _mlp_forward(cfg),
    }
    out = {
        "mamba": cfg.count("M") * per_block["M"],
        "attention": cfg.count("*") * per_block["*"],
        "mlp": cfg.count("-") * per_block["-"],
        "lm_head": 3 * 2 * cfg.d_model * cfg.vocab_size,
    }
    out["total"] = sum(out.values())
    out["forward"] = out["total"] / 3
    out["per_block"] = per_block
    return out
