"""lm-evaluation-harness model `nvfp4train`: score a training run's checkpoint on lm-eval's tasks.

    python -m nvfp4train.eval.lm_eval_adapter run --model nvfp4train \\
        --model_args run_dir=runs/exp/nvfp4,step=3000 --tasks hellaswag,arc_easy

is lm-eval's own command line (`lm_eval run ...`, same arguments, lm-eval's models included: `--model hf`
on an export of `python -m nvfp4train.export` works from here too) with this model registered; lm-eval
does not discover model plugins by itself, so a plain `lm_eval --model nvfp4train` works only in a Python
process that imported this module first (e.g. `lm_eval.simple_evaluate(model="nvfp4train", ...)` after
`import nvfp4train.eval.lm_eval_adapter`). Standard benchmarks need a reachable dataset hub; tasks
defined on local files run offline: `--include_path evals/lm_eval` has the offline tasks of
`python -m nvfp4train.eval` (run from the repository root). Needs lm-eval >= 0.4.10 (its `run` command):
`pip install 'nvfp4train[lm-eval]'`.

model_args: run_dir (required), step (default: the latest checkpoint), batch_size (16), device (cuda when
available, else cpu), max_length (the run's train.seq_len), dtype (bfloat16: BF16 autocast, as the paper
evaluates; float32: none, which lm-eval's `hf` model on a float32 export matches to ~1e-6 per logit).

Like lm-eval's own models (its TemplateLM): a (context, continuation) pair is encoded whole and split
where the context's tokens end, trailing spaces of the context go to the continuation, an empty context
is the end-of-text token. The checkpoint is evaluated with plain linears (nvfp4train.eval.load_run_model);
log-likelihoods come from the same function as `python -m nvfp4train.eval` (harness.loglikelihoods).
"""

from __future__ import annotations

import sys

import torch

try:  # this module is lm-eval's model plugin: without lm-eval there is nothing to register
    # lm-eval fills its model registry with its own models only while that registry is empty: they are
    # registered first, so that registering ours below leaves `--model hf` and the others usable.
    import lm_eval.models  # noqa: F401
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as e:
    _MISSING = f"the lm-eval adapter needs the lm-eval package ({e.msg}): pip install 'nvfp4train[lm-eval]'"
    if __name__ == "__main__":  # python -m nvfp4train.eval.lm_eval_adapter: one line, not a traceback
        sys.exit(f"error: {_MISSING}")
    raise ImportError(_MISSING, name=e.name) from None

from nvfp4train.eval import harness
from nvfp4train.eval.weights import RunError, load_run_model
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls

MIN_LM_EVAL = (0, 4, 10)  # the `run` subcommand and the lazily filled model registry
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@register_model("nvfp4train")
class NVFP4TrainLM(TemplateLM):
    def __init__(
        self, run_dir: str, step=None, batch_size=16, device="auto", max_length=None, dtype="bfloat16", **_ignored
    ):
        super().__init__()
        from nvfp4train.data import load_tokenizer

        if str(dtype) not in DTYPES:
            raise RunError(f"dtype={dtype!r}: allowed: {', '.join(DTYPES)}")
        self.dtype = DTYPES[str(dtype)]
        # lm-eval passes device="cuda" by default; like its HF model, fall back to the CPU without one.
        self.device_name = "cuda" if torch.cuda.is_available() and str(device) != "cpu" else "cpu"
        self.model, config, self.checkpoint = load_run_model(
            run_dir, int(step) if step not in (None, "") else None, self.device_name
        )
        self.nvfp4_tokenizer = load_tokenizer(config["data"]["tokenizer"])
        self.max_length = int(max_length or config["train"]["seq_len"])
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16  # lm-eval may pass "auto"

    @property
    def eot_token_id(self) -> int:
        return self.nvfp4_tokenizer.eos_id

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.nvfp4_tokenizer.encode(string)  # our tokenizers add no special tokens

    def tok_decode(self, tokens, **kwargs) -> str:
        return self.nvfp4_tokenizer.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        pairs = [(context_enc, continuation_enc) for _, context_enc, continuation_enc in requests]
        return harness.loglikelihoods(self.model, pairs, self.max_length, self.batch_size, self.device_name, self.dtype)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each token scored once, in disjoint windows of max_length predictions that see one token before
        them (lm-eval's get_rolling_token_windows with context_len=1, as its HF model)."""
        out = []
        for req in requests:
            tokens = [self.prefix_token_id] + self.tok_encode(req.args[0])
            pairs = [
                (tokens[:start], tokens[start : start + self.max_length])
                for start in range(1, len(tokens), self.max_length)
            ]
            out.append(
                sum(
                    s
                    for s, _ in harness.loglikelihoods(
                        self.model, pairs, self.max_length, self.batch_size, self.device_name, self.dtype
                    )
                )
            )
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding with the decode cache (nvfp4train.model.decode) until a stop string, the
        end-of-text token or max_gen_toks tokens; the context keeps its last max_length - max_gen_toks
        tokens, as lm-eval's HF model."""
        from nvfp4train.model.decode import decode_step, prefill

        out = []
        for req in requests:
            context, gen_kwargs = req.args
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", 256))
            tokens = (self.tok_encode(context) or [self.eot_token_id])[-max(self.max_length - max_new, 1) :]
            generated: list[int] = []
            text = ""
            with (
                torch.autocast(
                    torch.device(self.device_name).type, dtype=self.dtype, enabled=self.dtype != torch.float32
                ),
                cpu_bf16_matmuls(self.device_name, enabled=self.dtype == torch.bfloat16),
            ):
                logits, cache = prefill(self.model, torch.tensor([tokens], device=self.device_name))
                for _ in range(max_new):
                    next_id = int(logits[0].float().argmax())
                    if next_id == self.eot_token_id:
                        break
                    generated.append(next_id)
                    text = self.tok_decode(generated)
                    if any(stop in text for stop in until):
                        break
                    logits = decode_step(self.model, torch.tensor([next_id], device=self.device_name), cache)
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


def lm_eval_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("lm-eval").split(".")[:3] if p.isdigit())


def main() -> None:
    """lm-eval's command line, with the `nvfp4train` model registered."""
    if lm_eval_version() < MIN_LM_EVAL:
        print(
            f"error: lm-eval {'.'.join(map(str, lm_eval_version()))} is installed; this command needs lm-eval >= "
            f"{'.'.join(map(str, MIN_LM_EVAL))}: pip install 'nvfp4train[lm-eval]'",
            file=sys.stderr,
        )
        sys.exit(2)
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "lm_eval"
    try:
        cli_evaluate()
    except RunError as e:  # a bad run_dir, step or dtype in --model_args: one line, not a traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
