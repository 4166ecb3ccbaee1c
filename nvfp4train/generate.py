"""`python -m nvfp4train.generate run_dir=RUN prompt="Once upon a time" [max_new_tokens=100] [temperature=0.8]
[top_k=50] [num_samples=1] [step=N] [seed=0] [device=auto]`: sample text from a run's checkpoint.

The checkpoint (any engine or sharding) is loaded with plain linears in BF16 autocast on a GPU and FP32
on the CPU (dtype=...), as `python -m nvfp4train.eval` does. The prompt runs through the model once;
every new token then costs one token's work (nvfp4train/model/decode.py: the Mamba blocks' conv and
SSM state, the attention blocks' keys and values); the prompt and the new tokens may be up to 8 times
the run's train.seq_len long. temperature=0 decodes greedily; top_k=0 samples
from the whole vocabulary. Sampling stops at max_new_tokens or at the end-of-text token. An empty
prompt starts a new document (the end-of-text token). Prints each sample; with json=true one JSON
line per sample instead. Options: configs/generate.yaml. Bad input ends with one line, exit code 2.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import torch

from nvfp4train.config import ConfigError, help_requested, load, usage
from nvfp4train.eval.weights import RunError, load_run_model, pick_device
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator) -> torch.Tensor:
    """logits [b, vocab] -> next token ids [b]: greedy at temperature 0, else softmax(logits / T) over
    the top_k most likely tokens (all with top_k=0)."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)


@torch.no_grad()
def generate(
    model,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    num_samples: int = 1,
    eos_id: int | None = None,
    seed: int = 0,
    device="cpu",
    dtype: torch.dtype = torch.float32,
) -> list[list[int]]:
    """New token ids for each of num_samples continuations of prompt_ids (each ends before eos_id)."""
    from nvfp4train.model.decode import decode_step, prefill

    generator = torch.Generator().manual_seed(seed)
    tokens = torch.tensor([prompt_ids] * num_samples, device=device)
    out = [[] for _ in range(num_samples)]
    done = torch.zeros(num_samples, dtype=torch.bool, device=device)
    autocast = torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype != torch.float32)
    with autocast, cpu_bf16_matmuls(device, enabled=dtype == torch.bfloat16):
        logits, cache = prefill(model, tokens)
        for i in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, generator)
            if eos_id is not None:
                done |= nxt == eos_id
            for row in range(num_samples):
                if not done[row]:
                    out[row].append(int(nxt[row]))
            if bool(done.all()) or i == max_new_tokens - 1:
                break
            logits = decode_step(model, nxt, cache)
    return out


# The longest context sampled, as a multiple of the run's train.seq_len: the model never saw longer ones, and the
# attention blocks' cache grows with every token (a typo of a few zeros would run for days or exhaust memory).
CONTEXT_FACTOR = 8


def check_length(prompt_tokens: int, max_new_tokens: int, run_config: dict) -> None:
    """Refuse a prompt plus max_new_tokens longer than CONTEXT_FACTOR x the run's train.seq_len."""
    seq_len = (run_config.get("train") or {}).get("seq_len")
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        return  # a config.yaml without it: nothing to measure against
    limit = CONTEXT_FACTOR * seq_len
    if prompt_tokens + max_new_tokens > limit:
        raise RunError(
            f"max_new_tokens={max_new_tokens}: the prompt ({prompt_tokens} tokens) and the new tokens may be at "
            f"most {limit} tokens ({CONTEXT_FACTOR} x the run's train.seq_len={seq_len}): allowed max_new_tokens "
            f"<= {max(limit - prompt_tokens, 0)}"
        )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if help_requested(argv):
        print(usage("generate", __doc__))
        return 0
    # The prompt is taken verbatim: Hydra's override grammar would read "1, 2" as a list or "42" as a number.
    prompts = [a.split("=", 1)[1] for a in argv if a.startswith("prompt=")]
    try:
        cfg = load("generate", [a for a in argv if not a.startswith("prompt=")])
        if prompts:
            cfg = dataclasses.replace(cfg, prompt=prompts[-1])
        device = pick_device(cfg.device)
        dtype = DTYPES[cfg.dtype] if cfg.dtype != "auto" else (torch.bfloat16 if device == "cuda" else torch.float32)
        model, run_config, ckpt = load_run_model(cfg.run_dir, cfg.step, device)
        from nvfp4train.data import load_tokenizer

        try:
            tokenizer = load_tokenizer(run_config["data"]["tokenizer"])
        except (ValueError, FileNotFoundError, ImportError) as e:
            raise RunError(f"{cfg.run_dir / 'config.yaml'}: data.tokenizer: {e}") from None
        prompt_ids = tokenizer.encode(cfg.prompt) or [tokenizer.eos_id]
        check_length(len(prompt_ids), cfg.max_new_tokens, run_config)
    except (ConfigError, RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    samples = generate(
        model,
        prompt_ids,
        cfg.max_new_tokens,
        cfg.temperature,
        cfg.top_k,
        cfg.num_samples,
        tokenizer.eos_id,
        cfg.seed,
        device,
        dtype,
    )
    seconds = time.perf_counter() - t0
    for i, ids in enumerate(samples):
        text = tokenizer.decode(ids)
        if cfg.json:
            print(
                json.dumps(
                    {"sample": i, "checkpoint": str(ckpt), "prompt": cfg.prompt, "text": text, "tokens": len(ids)}
                )
            )
        else:
            if cfg.num_samples > 1:
                print(f"--- sample {i} ---")
            print(cfg.prompt + text)
    n = sum(len(s) for s in samples)
    print(f"[{ckpt.name}: {n} tokens in {seconds:.2f} s on {device}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
