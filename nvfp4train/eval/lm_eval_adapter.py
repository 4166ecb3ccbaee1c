"""lm-evaluation-harness model `nvfp4train`: score a training run's checkpoint on lm-eval's tasks.

    python -m nvfp4train.eval.lm_eval_adapter run --model nvfp4train \
        --model_args run_dir=runs/exp/nvfp4,step=3000 --tasks hellaswag,arc_easy

is lm-eval's own command line (`lm_eval ...`, same arguments) with this model registered; lm-eval does
not discover model plugins by itself, so a plain `lm_eval --model nvfp4train` works only in a Python
process that imported this module first (e.g. `lm_eval.simple_evaluate(model="nvfp4train", ...)` after
`import nvfp4train.eval.lm_eval_adapter`). Standard benchmarks need a reachable dataset hub; tasks
defined on local files (`--include_path`) run offline. lm-eval is optional: `pip install 'lm-eval>=0.4'`.

The checkpoint is evaluated in BF16 with plain linears (nvfp4train.eval.load_run_model); log-likelihoods
come from the same function as `python -m nvfp4train.eval` (nvfp4train.eval.harness.loglikelihoods).
"""
from __future__ import annotations

import sys

import torch

try:  # this module is lm-eval's model plugin: without lm-eval there is nothing to register
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:
    _MISSING = f"the lm-eval adapter needs the lm-eval package ({e.msg}): pip install 'nvfp4train[lm-eval]'"
    if __name__ == "__main__":  # python -m nvfp4train.eval.lm_eval_adapter: one line, not a traceback
        sys.exit(f"error: {_MISSING}")
    raise ImportError(_MISSING, name=e.name) from None

from nvfp4train.eval import harness
from nvfp4train.eval.weights import load_run_model


@register_model("nvfp4train")
class NVFP4TrainLM(LM):
    def __init__(self, run_dir: str, step=None, batch_size=16, device="auto", max_length=None, **_ignored):
        super().__init__()
        from nvfp4train.data import load_tokenizer

        # lm-eval passes device="cuda" by default; like its HF model, fall back to the CPU without one.
        self.device_name = "cuda" if torch.cuda.is_available() and str(device) != "cpu" else "cpu"
        self.model, config, self.checkpoint = load_run_model(run_dir, int(step) if step not in (None, "") else None,
                                                             self.device_name)
        self.tokenizer = load_tokenizer(config["data"]["tokenizer"])
        self.max_length = int(max_length or config["train"]["seq_len"])
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16  # lm-eval may pass "auto"

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        # As lm-eval's HF model: spaces at the end of the context belong to the continuation, and an
        # empty context is the end-of-text token (the document boundary the model was trained with).
        spaces = len(context) - len(context.rstrip(" "))
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        ctx = self.tokenizer.encode(context) if context else [self.tokenizer.eos_id]
        return ctx, self.tokenizer.encode(continuation)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self._encode_pair(*req.args) for req in requests]
        return harness.loglikelihoods(self.model, pairs, self.max_length, self.batch_size, self.device_name)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each token scored once, with as much preceding context as fits (lm-eval's rolling windows)."""
        out = []
        for req in requests:
            tokens = [self.tokenizer.eos_id] + self.tokenizer.encode(req.args[0])
            pairs = [(tokens[:start], tokens[start:start + self.max_length])
                     for start in range(1, len(tokens), self.max_length)]
            out.append(sum(s for s, _ in harness.loglikelihoods(self.model, pairs, self.max_length,
                                                                  self.batch_size, self.device_name)))
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding until a stop string or max_gen_toks tokens (no KV cache: a small model's
        full forward per token is fast enough for evaluation)."""
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            tokens = self.tokenizer.encode(context) or [self.tokenizer.eos_id]
            generated: list[int] = []
            text = ""
            for _ in range(int(gen_kwargs.get("max_gen_toks", 256))):
                ids = torch.tensor([(tokens + generated)[-self.max_length:]], device=self.device_name)
                with torch.autocast(torch.device(self.device_name).type, dtype=torch.bfloat16):
                    next_id = int(self.model(ids)[0, -1].argmax())
                if next_id == self.tokenizer.eos_id:
                    break
                generated.append(next_id)
                text = self.tokenizer.decode(generated)
                if any(stop in text for stop in until):
                    break
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


def main() -> None:
    """lm-eval's command line, with the `nvfp4train` model registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "lm_eval"
    cli_evaluate()


if __name__ == "__main__":
    main()
