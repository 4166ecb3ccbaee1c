"""One Triton kernel for a whole AdamW step with its gradient-clipping coefficient, over every parameter.

Clipping as `torch.nn.utils.clip_grad_norm_` does it multiplies every gradient by the coefficient in place
(read 4 bytes, write 4 a parameter), and fused AdamW then reads the gradients again. Here the step's kernel
multiplies each gradient by the coefficient as it loads it, the same FP32 product `_foreach_mul_` forms, and
leaves the gradients in memory as backward wrote them.

The update is the arithmetic of torch's fused AdamW on CUDA (`torch._fused_adamw_` on FP32 tensors, torch 2.13),
all of it in FP32 with the hyperparameters rounded to FP32:

    p  = fma(-(lr * weight_decay), p, p)                  decoupled weight decay
    m  = fma(beta1, m, fma(-beta1, g, g))                 the moments as lerps, by fused multiply-adds
    v  = fma(beta2, v, fma(-beta2, g * g, g * g))
    p  = p - (step_size * m) / (sqrt(v) / sqrt(1 - beta2 ** step) + eps),   step_size = lr / (1 - beta1 ** step)

with correctly rounded square roots and divisions, and the two bias corrections from each parameter's step count
on the device (PyTorch's FP32 `pow`, outside the kernel): the same bits as torch's fused AdamW in weights and both
moments (`tests/train/test_adamw_kernel.py` checks it over a run of steps; the GPU comparison:
docs/results/code-measurements.md).

A step skips every write where `found_inf` is nonzero, as fused AdamW does; the caller keeps the step counts.
The kernel reads its tensors through a table of addresses (one row per parameter: param, grad, exp_avg,
exp_avg_sq, numel), and each program takes one chunk of one parameter: one launch per parameter group, whatever
the number of parameters.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
CHUNK = 4 * BLOCK  # elements per program


@triton.jit
def _adamw_clip_kernel(
    TABLE, CHUNKS, HYPER, BIAS, COEF, FOUND_INF, DECAY: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr
):
    pid = tl.program_id(0)
    tensor = tl.load(CHUNKS + 2 * pid).to(tl.int64)
    chunk = tl.load(CHUNKS + 2 * pid + 1).to(tl.int64)
    row = TABLE + tensor * 5
    p_ptr = tl.load(row).to(tl.pointer_type(tl.float32))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(tl.float32))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    n = tl.load(row + 4)
    n = tl.where(tl.load(FOUND_INF) == 0, n, 0)  # a skipped step writes nothing
    lr_wd = tl.load(HYPER) * tl.load(HYPER + 1)
    beta1 = tl.load(HYPER + 2)
    beta2 = tl.load(HYPER + 3)
    eps = tl.load(HYPER + 4)
    step_size = tl.load(BIAS + 2 * tensor)
    bias_correction2_sqrt = tl.load(BIAS + 2 * tensor + 1)
    coef = tl.load(COEF)
    start = chunk * (BLOCK * BLOCKS)
    for i in range(BLOCKS):  # a compile-time count: Triton's interpreter cannot loop to a run-time bound
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0) * coef
        p = tl.load(p_ptr + offs, mask=mask, other=0.0)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        if DECAY:  # without weight decay fused AdamW leaves p as it is (a -0.0 stays -0.0)
            p = tl.fma(-lr_wd, p, p)
        g2 = g * g
        m = tl.fma(beta1, m, tl.fma(-beta1, g, g))
        v = tl.fma(beta2, v, tl.fma(-beta2, g2, g2))
        denom = tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps
        p = p - tl.div_rn(step_size * m, denom)
        tl.store(p_ptr + offs, p, mask=mask)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)


class StepTables:
    """The address table and the chunk map of one parameter group, checked and rebuilt when a tensor moves (a
    backward that allocates the gradients afresh, a loaded optimizer state) and reused otherwise."""

    def __init__(self):
        self._key: tuple | None = None
        self._table: torch.Tensor | None = None
        self._chunks: torch.Tensor | None = None

    def get(self, params, grads, exp_avgs, exp_avg_sqs) -> tuple[torch.Tensor, torch.Tensor]:
        columns = (params, grads, exp_avgs, exp_avg_sqs)
        key = tuple(t.data_ptr() for column in columns for t in column)
        if key != self._key:
            for name, column in zip(("params", "grads", "exp_avgs", "exp_avg_sqs"), columns):
                for t in column:
                    if t.dtype != torch.float32 or not t.is_contiguous():
                        raise ValueError(f"adamw_clip_step: {name} must be contiguous FP32, got {t.dtype} {t.shape}")
            device = params[0].device
            rows = [[*(t.data_ptr() for t in ts), ts[0].numel()] for ts in zip(*columns)]
            chunks = [[i, c] for i, p in enumerate(params) for c in range(triton.cdiv(p.numel(), CHUNK))]
            self._table = _to_device(torch.tensor(rows, dtype=torch.int64), device)
            self._chunks = _to_device(torch.tensor(chunks, dtype=torch.int32), device)
            self._key = key
        return self._table, self._chunks


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor's copy on `device`; to a GPU pinned and non-blocking (a plain copy from pageable memory
    waits for the GPU to finish the work queued before it: the whole backward)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def adamw_clip_step(
    tables: StepTables,
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    clip_coef: torch.Tensor,
    found_inf: torch.Tensor,
) -> None:
    """One AdamW update of `params` (contiguous FP32 CUDA tensors) from `grads` * `clip_coef` (a device scalar),
    skipped where `found_inf` (a device scalar) is nonzero. `steps` hold each parameter's step count, already
    counting this step (FP32 device scalars, as fused AdamW keeps them)."""
    table, chunks = tables.get(params, grads, exp_avgs, exp_avg_sqs)
    device = params[0].device
    hyper = _to_device(torch.tensor([lr, weight_decay, beta1, beta2, eps], dtype=torch.float32), device)
    lr_t, beta1_t, beta2_t = hyper[0], hyper[2], hyper[3]
    # Per parameter, from its step count on the device: the step size and sqrt(1 - beta2 ** step), in FP32.
    step = torch.stack(steps)
    bias = torch.stack([lr_t / (1 - beta1_t**step), (1 - beta2_t**step).sqrt()], dim=1)
    _adamw_clip_kernel[(chunks.shape[0],)](
        table,
        chunks,
        hyper,
        bias,
        clip_coef.float(),
        found_inf.float(),
        DECAY=weight_decay != 0,
        BLOCK=BLOCK,
        BLOCKS=CHUNK // BLOCK,
        num_warps=4,
    )
