"""The training loop: wires model, precision, data, optimizer, parallelism, checkpoints and metrics.

One optimizer step, as data flows:
  1. the loader hands this rank `grad_accum` micro-batches of the global batch;
  2. the precision controller applies its schedule for the current token fraction;
  3. forward under BF16 autocast (each linear is the precision room's layer), FP32 cross-entropy,
     backward; FP32 gradients accumulate over micro-batches (DDP/FSDP2 sync on the last one);
  4. global-norm clipping; a non-finite loss or gradient skips the step;
  5. AdamW updates the FP32 master weights at this step's learning rate;
  6. metrics, evaluation and checkpoints at their intervals; SIGTERM/SIGUSR1 save and exit.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from nvfp4train import dist
from nvfp4train.optim import lr_at
from nvfp4train.train import checkpoint
from nvfp4train.train.config import ConfigError, RunConfig
from nvfp4train.train.engines import build_engine
from nvfp4train.train.guards import NonFiniteGuard, SpikeDetector
from nvfp4train.train.metrics import MetricsLogger, ProgressBar


class _StopSignal:
    """Remembers SIGTERM / SIGUSR1 (SLURM preemption) so the loop can checkpoint and leave cleanly."""

    def __init__(self):
        self.received: int | None = None
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.received = signum


def _check_out_dir(out_dir: Path) -> None:
    """Fail early if out_dir cannot be created or written, without creating anything yet."""
    existing = out_dir.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"out_dir={str(out_dir)!r}: not writable ({existing} is not a writable directory)")


def _build(cfg: RunConfig, info: dist.DistInfo):
    """Model (with the precision room's linears), precision controller and data, all validated."""
    from nvfp4train.data import build_train_loader, build_val_data
    from nvfp4train.model import HybridLM, ModelConfig
    from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory

    try:
        model_cfg = ModelConfig.from_dict(cfg.model)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model: {e}") from None
    try:
        policy = PrecisionPolicy.from_dict(cfg.precision)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"precision: {e}") from None
    t = cfg.train
    accum_unit = t.micro_batch_size * info.world_size
    if t.global_batch_size % accum_unit:
        raise ConfigError(f"train.global_batch_size={t.global_batch_size} must be a multiple of "
                          f"train.micro_batch_size x world size = {accum_unit}")
    try:
        loader = build_train_loader(cfg.data, seq_len=t.seq_len, global_batch_size=t.global_batch_size,
                                    micro_batch_size=t.micro_batch_size, rank=info.rank,
                                    world_size=info.world_size, seed=cfg.seed,
                                    total_samples=t.max_steps * t.global_batch_size)
        val_data = build_val_data(cfg.data, seq_len=t.seq_len, max_sequences_per_domain=t.eval_sequences)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"data: {e}") from None
    if loader.tokenizer.vocab_size > model_cfg.vocab_size:
        raise ConfigError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
                          f"{loader.tokenizer.vocab_size} tokens (data.tokenizer)")

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    factory = build_linear_factory(policy, n_blocks=len(model_cfg.pattern), seed=cfg.seed)
    model = HybridLM(model_cfg, linear_factory=factory).to(info.device)
    controller = PrecisionController(policy, model)
    return model_cfg, model, controller, loader, val_data


@torch.no_grad()
def evaluate(model, val_data: dict, micro_batch_size: int, device, autocast) -> dict[str, float]:
    """Mean next-token loss per held-out domain."""
    was_training = model.training
    model.eval()
    out = {}
    for domain, seqs in val_data.items():
        total, count = 0.0, 0
        for i in range(0, len(seqs), micro_batch_size):
            chunk = seqs[i:i + micro_batch_size].to(device)
            with autocast():
                logits = model(chunk[:, :-1])
            total += F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
            count += chunk[:, 1:].numel()
        out[f"val/{domain}"] = total / max(count, 1)
    if out:
        out["val/mean"] = sum(out.values()) / len(out)
    model.train(was_training)
    return out


def run(cfg: RunConfig) -> dict:
    """Train as configured; return a summary (final step, loss, checkpoint path)."""
    info = dist.init_distributed(cfg.train.device)
    t = cfg.train
    _check_out_dir(cfg.out_dir)
    model_cfg, model, controller, loader, val_data = _build(cfg, info)
    if info.is_main:
        try:
            cfg.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"out_dir={str(cfg.out_dir)!r}: not writable ({e.strerror})") from None
    dist.barrier(info)

    from nvfp4train.model import flops_per_token, param_groups
    from nvfp4train.model.mfu import peak_flops

    grad_accum = t.global_batch_size // (t.micro_batch_size * info.world_size)
    tokens_per_step = t.global_batch_size * t.seq_len
    ckpt_root = cfg.out_dir / "checkpoints"
    guard, spikes = NonFiniteGuard(t.max_nonfinite_steps), SpikeDetector(t.spike_factor)
    engine = build_engine(model, lambda m: param_groups(m, cfg.optim.weight_decay), cfg.optim, t, info, guard,
                          grad_accum)
    autocast = lambda: torch.autocast(info.device.type, dtype=torch.bfloat16)  # noqa: E731

    # ---- resume
    start_step, wandb_id, resume_from = 0, None, None
    if t.resume == "auto":
        existing = checkpoint.list_checkpoints(ckpt_root)
        resume_from = existing[-1] if existing else None
    elif t.resume != "never":
        resume_from = Path(t.resume)
    if resume_from is not None:
        meta, state = checkpoint.load(resume_from, engine, info.rank, cfg.model)
        start_step, wandb_id = int(meta["step"]), meta.get("wandb_id")
        loader.load_state_dict(state["loader"])
        controller.load_state_dict(state["precision"])
        guard.load_state_dict(state["guard"])
        spikes.load_state_dict(state["spikes"])
        torch.set_rng_state(state["rng_cpu"])
        if info.device.type == "cuda" and "rng_cuda" in state:
            torch.cuda.set_rng_state(state["rng_cuda"])

    logger = MetricsLogger(cfg.out_dir, enabled=info.is_main)
    if info.is_main:
        from omegaconf import OmegaConf
        (cfg.out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg.to_dict()))
    logger.open(resume_step=start_step if resume_from is not None else None)
    wandb_id = logger.start_wandb(t.wandb, cfg.to_dict(), cfg.experiment, cfg.out_dir, wandb_id)
    bar = ProgressBar(t.progress, info.is_main, total=t.max_steps, initial=start_step, log_every=t.log_every)
    if info.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        where = f"resumed from {resume_from}" if resume_from else "from scratch"
        bar.write(f"model {model_cfg.name}: {n_params / 1e6:.2f}M params | precision {cfg.precision.get('name', '?')} "
                  f"({controller.backend_name}) | {t.parallel if info.world_size > 1 or t.parallel == 'deepspeed' else 'single'} "
                  f"x{info.world_size} on {info.device.type} | {t.max_steps} steps x {tokens_per_step} tokens | {where}")

    flops_tok = flops_per_token(model_cfg, t.seq_len)["total"]
    from nvfp4train.precision import gemm_peak_kind
    gemm_precision = gemm_peak_kind(controller.policy, controller.backend_name)  # emulated: the BF16 peak
    peak = peak_flops(info.device, gemm_precision) if info.device.type == "cuda" else None

    def save(step: int) -> Path:
        state = {"loader": loader.state_dict(), "precision": controller.state_dict(),
                 "guard": guard.state_dict(), "spikes": spikes.state_dict(), "rng_cpu": torch.get_rng_state()}
        if info.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state()
        meta = {"model_config": cfg.model, "tokens": step * tokens_per_step, "wandb_id": wandb_id,
                "experiment": cfg.experiment}
        return checkpoint.save(ckpt_root, step, engine, info.rank, info.world_size, meta, state, t.keep_last,
                               barrier=lambda: dist.barrier(info))

    stop = _StopSignal()
    last_ckpt, loss_value, step = None, float("nan"), start_step
    model.train()
    try:
        for step in range(start_step + 1, t.max_steps + 1):
            t0 = time.perf_counter()
            switch_msg = controller.on_step((step - 1) / t.max_steps)
            if switch_msg and info.is_main:
                bar.write(f"step {step}: {switch_msg}")
            lr = lr_at(step - 1, t.max_steps, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.schedule)
            micro_batches = [loader.next_microbatch() for _ in range(grad_accum)]
            loss_value, norm_value, applied = engine.train_step(micro_batches, lr, step)
            spike = spikes.update(loss_value)
            if info.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            tokens_per_s = tokens_per_step / dt
            bar.update(step, loss_value, tokens_per_s)
            if spike and info.is_main:
                bar.write(f"step {step}: loss spike {loss_value:.4f} (running mean {spikes.ema:.4f})")

            is_last = step == t.max_steps
            record = None
            if step % t.log_every == 0 or is_last or step == start_step + 1 or not applied or spike:
                record = {"step": step, "tokens": step * tokens_per_step, "loss": loss_value, "lr": lr,
                          "grad_norm": norm_value, "tokens_per_s": tokens_per_s, "step_time_s": dt,
                          "skipped_steps": guard.total_skipped, "loss_spikes": spikes.spikes,
                          "step_skipped": not applied, "loss_spike": spike}
                if peak is not None:
                    record["mfu"] = flops_tok * tokens_per_s / info.world_size / peak[0]
                record.update(loader.stats())  # keys already start with "data/"
                record.update(controller.quant_stats())
            if (t.eval_every and step % t.eval_every == 0) or is_last:
                record = record or {"step": step, "tokens": step * tokens_per_step}
                record.update(evaluate(engine.module, val_data, t.micro_batch_size, info.device, autocast))
            if record is not None:
                logger.log(record)

            preempted = _agree(stop.received is not None, info)
            if (t.save_every and step % t.save_every == 0) or is_last or preempted:
                last_ckpt = save(step)
            if preempted:
                if info.is_main:
                    bar.write(f"received signal {stop.received}: checkpoint {last_ckpt} saved at step {step}; "
                              "exiting so the job can be requeued")
                break
    finally:
        bar.close()
        logger.close()
    dist.barrier(info)
    return {"step": step, "loss": loss_value, "checkpoint": str(last_ckpt) if last_ckpt else None,
            "out_dir": str(cfg.out_dir), "rank": info.rank}


def _agree(flag: bool, info: dist.DistInfo) -> bool:
    """True on every rank if it is true on any (a signal may reach one rank first)."""
    if info.world_size == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item())
