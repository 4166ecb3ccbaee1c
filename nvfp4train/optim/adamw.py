"""AdamW over FP32 master weights.

The model's parameters are kept in FP32 and are the master weights; forward and backward run under
BF16 autocast (or FSDP2's bf16 `param_dtype`), so every GEMM sees BF16 (or quantized) compute
weights while gradients, their accumulation over micro-batches and both Adam moments stay FP32.
"""

from __future__ import annotations

import torch

from nvfp4train.formats.impl import triton_available
from nvfp4train.optim.config import OptimConfig


class ClippingAdamW(torch.optim.AdamW):
    """torch's AdamW whose step also multiplies the gradients by `clip_coef`, a device scalar the caller sets
    before `step` (as it sets `found_inf`; None: 1). Where every parameter, gradient and moment is a contiguous
    FP32 CUDA tensor, the group is fused and our Triton kernels may run (`formats.impl.triton_available`:
    triton installed, NVFP4TRAIN_TRITON not 0), one Triton kernel a group does both (`adamw_kernel.py`: fused
    AdamW's arithmetic, the gradients left as they are in memory); elsewhere the gradients are multiplied in
    place, as clip_grad_norm_ does, and torch's step runs. The state (moments, step counts) is AdamW's, so
    checkpoints load in either."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clip_coef: torch.Tensor | None = None
        self._tables: dict[int, object] = {}

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._fuses = None

    def fuses_clipping(self) -> bool:
        """Whether `step` runs the Triton kernel (decided from the parameters' placement at the first call after
        the groups last changed)."""
        if getattr(self, "_fuses", None) is None:
            self._fuses = self._kernel_applies()
        return self._fuses

    def _kernel_applies(self) -> bool:
        params = [p for group in self.param_groups for p in group["params"]]
        return (
            bool(params)
            and all(group["fused"] and not group["amsgrad"] and not group["maximize"] for group in self.param_groups)
            and all(type(p) in (torch.Tensor, torch.nn.Parameter) and p.is_cuda and p.is_contiguous() for p in params)
            and triton_available()
        )

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("ClippingAdamW.step takes no closure")
        coef = self.clip_coef
        if not self.fuses_clipping():
            if coef is not None:
                grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
                if grads:
                    torch._foreach_mul_(grads, coef.to(grads[0].device))
            # AdamW's step without the hook wrapper torch puts on it once an AdamW exists: this step's own
            # wrapper already runs the step hooks
            step = torch.optim.AdamW.step
            return (step.__wrapped__ if getattr(step, "hooked", False) else step)(self)
        from .adamw_kernel import StepTables, adamw_clip_step

        found_inf = getattr(self, "found_inf", None)
        for index, group in enumerate(self.param_groups):
            params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = [], [], [], [], [], []
            self._init_group(group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps)
            if not params:
                continue
            device = params[0].device
            skip = found_inf.to(device) if found_inf is not None else torch.zeros((), device=device)
            torch._foreach_add_(steps, 1)  # fused AdamW counts the step, and takes it back if skipped
            beta1, beta2 = (float(b) for b in group["betas"])
            adamw_clip_step(
                self._tables.setdefault(index, StepTables()),
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                steps,
                lr=float(group["lr"]),
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                clip_coef=coef.to(device) if coef is not None else torch.ones((), device=device),
                found_inf=skip,
            )
            if found_inf is not None:
                torch._foreach_sub_(steps, [skip] * len(steps))
        return None


def build_optimizer(param_groups: list[dict], cfg: OptimConfig, fused: bool = False) -> ClippingAdamW:
    """AdamW on the given groups (each group may carry its own `weight_decay`). fused=True: the fused
    kernel, which skips the whole update (moments and step count included) where `optimizer.found_inf`
    is 1, decided on the device (train/engines/torch.py), and applies `optimizer.clip_coef` to the gradients."""
    for group in param_groups:
        for p in group["params"]:
            if p.dtype != torch.float32:
                raise TypeError(f"master weights must be FP32, found a {p.dtype} parameter of shape {tuple(p.shape)}")
    # foreach and fused are the fast paths on CPU and GPU; both are bit-reproducible run to run.
    return ClippingAdamW(
        param_groups,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        **({"fused": True} if fused else {"foreach": True}),
    )


HYPERPARAMETERS = ("betas", "eps", "weight_decay")


def get_hyperparameters(optimizer) -> list[dict]:
    """Each group's betas, eps and weight_decay (the learning rate is set every step from the schedule)."""
    return [{k: group[k] for k in HYPERPARAMETERS if k in group} for group in optimizer.param_groups]


def set_hyperparameters(optimizer, values: list[dict]) -> None:
    """Put back what get_hyperparameters read: after loading a checkpoint, whose groups carry the values
    it was trained with, the run continues with those of its own config (a resume may change optim.*)."""
    groups = optimizer.param_groups
    if len(groups) != len(values):
        raise ValueError(f"the optimizer has {len(groups)} parameter groups after loading, {len(values)} before")
    for group, saved in zip(groups, values):
        group.update(saved)
