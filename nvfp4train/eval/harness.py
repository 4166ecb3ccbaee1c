"""Offline evaluation: held-out loss per data source and zero-shot tasks scored by log-likelihood.

Scoring follows lm-evaluation-harness (`loglikelihood` requests):
  - a request is (context, continuation); the continuation's tokens are scored given the context,
    the sum of their log-probabilities is its log-likelihood, and it is "greedy" when every one of
    its tokens is the argmax of the model's prediction (what greedy decoding would produce);
  - multiple_choice: `acc` picks the choice with the highest log-likelihood, `acc_norm` divides each
    by the choice's length in characters first (lm-eval's acc_norm);
  - cloze: `acc` is the fraction of items whose target is the greedy continuation (LAMBADA's metric),
    `ppl` the per-item perplexity exp(-mean log-likelihood);
  - exact_match: the same greedy criterion, reported as `exact_match` (an answer generated greedily
    token by token equals the reference exactly);
  - loss: mean next-token loss on the target (nats/token) and bits per byte.
Task definitions (kind, data file, description) are read from `evals/tasks.yaml`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from nvfp4train.eval.weights import RunError
from nvfp4train.precision.cpu_bf16 import cpu_bf16_matmuls

EVALS_DIR = Path(__file__).resolve().parents[2] / "evals"
TASKS_FILE = EVALS_DIR / "tasks.yaml"
KINDS = ("multiple_choice", "cloze", "exact_match", "loss")


# ------------------------------------------------------------------------------ log-likelihoods
@torch.no_grad()
def loglikelihoods(
    model,
    requests: list[tuple[list[int], list[int]]],
    max_len: int,
    batch_size: int = 16,
    device="cpu",
    dtype: torch.dtype = torch.bfloat16,
) -> list[tuple[float, bool]]:
    """(sum of log p(continuation | context), continuation is greedy) for each (context, continuation)
    token-id pair. Inputs longer than max_len + 1 tokens lose their oldest context tokens. The forward
    runs under `dtype` autocast (BF16, as the paper evaluates; torch.float32: none)."""
    results: list[tuple[float, bool] | None] = [None] * len(requests)
    scores, greedy, owners = [], [], []  # per request: its log-likelihood and greedy flag (device tensors)
    # Longest first, so a batch's padding is small and memory peaks at the start (as lm-eval does).
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        rows, spans = [], []
        for i in batch:
            context, continuation = requests[i]
            if not continuation:
                raise ValueError("a request has an empty continuation: nothing to score")
            tokens = (list(context) + list(continuation))[-(max_len + 1) :]
            n_cont = min(len(continuation), len(tokens) - 1)
            rows.append(tokens)
            spans.append(n_cont)
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for j, r in enumerate(rows):  # right padding: a causal model's earlier positions never see it
            ids[j, : len(r)] = torch.tensor(r)
        ids = ids.to(device)
        with (
            torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype != torch.float32),
            cpu_bf16_matmuls(device, enabled=dtype == torch.bfloat16),
        ):
            logits = model(ids[:, :-1])
        logprobs = F.log_softmax(logits.float(), dim=-1)
        for j, i in enumerate(batch):
            length, n = len(rows[j]), spans[j]
            target = ids[j, length - n : length]
            lp = logprobs[j, length - n - 1 : length - 1]
            # on the device until the end: a read here would wait for each batch before the next is queued
            scores.append(lp.gather(-1, target[:, None]).sum())
            greedy.append((lp.argmax(-1) == target).all())
            owners.append(i)
    if owners:
        for i, score, is_greedy in zip(owners, torch.stack(scores).tolist(), torch.stack(greedy).tolist()):
            results[i] = (score, bool(is_greedy))
    return results  # type: ignore[return-value]


@torch.no_grad()
def heldout_losses(model, val_data: dict[str, torch.Tensor], batch_size: int = 16, device="cpu") -> dict:
    """Mean next-token loss and perplexity per held-out source (the training loop's `val/*` in BF16). Each
    quantized weight is quantized once for all the batches (`weights_quantized_once`), and the batches' sums
    are read to the host once, then added up there in batch order."""
    from nvfp4train.precision.controller import quant_linears, weights_quantized_once

    sums, counts = {}, {}
    with weights_quantized_once(quant_linears(model)):
        for source, seqs in val_data.items():
            sums[source], counts[source] = [], 0
            for i in range(0, len(seqs), batch_size):
                chunk = seqs[i : i + batch_size].to(device)
                with torch.autocast(torch.device(device).type, dtype=torch.bfloat16), cpu_bf16_matmuls(device):
                    logits = model(chunk[:, :-1])
                sums[source].append(
                    F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
                )
                counts[source] += chunk[:, 1:].numel()
    every = [batch for batches in sums.values() for batch in batches]
    values = iter(torch.stack(every).tolist() if every else [])
    out = {}
    for source, batches in sums.items():
        total = 0.0
        for _ in batches:
            total += next(values)
        loss = total / counts[source]
        out[source] = {"loss": loss, "ppl": math.exp(loss), "tokens": counts[source]}
    return out


def in_training_precision(model, run_config: dict, ckpt: Path, device) -> tuple[torch.nn.Module, dict]:
    """(`model`'s weights in the run's model built with its precision policy's linears, what that precision
    is): the training precision of the checkpoint's step, so a run that switched to BF16 before it is in its
    switched precision (BF16 after a full switch), as its controller state in the checkpoint records."""
    from nvfp4train.eval.weights import model_config_for
    from nvfp4train.model import build_model
    from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory
    from nvfp4train.precision.recipe import recorded_run_config
    from nvfp4train.train import checkpoint
    from nvfp4train.train.heldout import runs_in_bf16

    config_file = ckpt.parents[1] / "config.yaml"
    try:
        policy = PrecisionPolicy.from_dict(recorded_run_config(run_config).get("precision") or {})
        factory = build_linear_factory(
            policy,
            n_blocks=len(model.cfg.pattern),
            seed=int(run_config.get("seed", 0)),
            modules=model.cfg.linear_modules(),
        )
    except (TypeError, ValueError) as e:  # a backend this machine lacks (precision.backend=te on a CPU) too
        raise RunError(
            f"{config_file}: precision: {e} (eval_precision=train and both build the run's linears)"
        ) from None
    quantized = build_model(model_config_for(run_config), layer_factory=factory)
    # strict=False for TE's `_extra_state`; the seed and sign buffers are the run's, made from its config
    loaded = quantized.load_state_dict(model.state_dict(), strict=False)
    unloaded = [k for k in loaded.missing_keys if not k.endswith("_extra_state")] + loaded.unexpected_keys
    if unloaded:
        raise RunError(f"{config_file}: precision: the run's linears do not take the checkpoint's {unloaded[0]}")
    controller = PrecisionController(policy, quantized)
    try:  # rank 0's trainer state: the switch is the same on every rank
        state = checkpoint.load_weights_only(ckpt / "rank_00000.pt")
        controller.load_state_dict(state["precision"])
    except checkpoint.CheckpointError as e:
        raise RunError(str(e)) from None
    except (KeyError, TypeError, ValueError) as e:
        raise RunError(
            f"{ckpt / 'rank_00000.pt'}: no precision controller state ({e}); not a training checkpoint"
        ) from None
    described = {
        "name": policy.name or str(policy.format),
        "backend": controller.backend_name,
        "switched": policy.switch.mode if controller.switched else None,
        "runs_in_bf16": runs_in_bf16(controller.layers),
    }
    return quantized.to(device).eval(), described


# ------------------------------------------------------------------------------ tasks
def load_task_definitions(path: Path = TASKS_FILE) -> dict[str, dict]:
    if not path.is_file():
        raise RunError(f"{path} not found: task definitions live in the repository's evals/ directory")
    tasks = (yaml.safe_load(path.read_text()) or {}).get("tasks") or {}
    for name, spec in tasks.items():
        if spec.get("kind") not in KINDS:
            raise RunError(f"{path}: task {name}: kind {spec.get('kind')!r} is not one of {', '.join(KINDS)}")
    return tasks


def select_tasks(names, definitions: dict[str, dict]) -> list[str]:
    """`all`, a comma-separated string or a list of task names -> the names, each checked."""
    if names in (None, "all"):
        return list(definitions)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in definitions]
    if unknown:
        raise RunError(f"tasks: unknown task {unknown[0]!r}; available: all, {', '.join(definitions)}")
    return list(names)


def read_items(spec: dict, base: Path = EVALS_DIR) -> list[dict]:
    path = base / spec["data"]
    if not path.is_file():
        raise RunError(f"{path} not found: build the task data with `python evals/build_tasks.py`")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def score_task(model, tokenizer, spec: dict, items: list[dict], max_len: int, batch_size: int, device) -> dict:
    kind = spec["kind"]
    encode = tokenizer.encode
    if kind == "multiple_choice":
        requests, owners = [], []
        for k, item in enumerate(items):
            context = encode(item["context"])
            for choice in item["choices"]:
                requests.append((context, encode(choice)))
                owners.append(k)
        scores = loglikelihoods(model, requests, max_len, batch_size, device)
        acc = acc_norm = 0
        at = 0
        for item in items:
            n = len(item["choices"])
            lls = [s for s, _ in scores[at : at + n]]
            norm = [ll / max(len(c), 1) for ll, c in zip(lls, item["choices"])]  # characters, as lm-eval
            acc += int(max(range(n), key=lls.__getitem__) == item["gold"])
            acc_norm += int(max(range(n), key=norm.__getitem__) == item["gold"])
            at += n
        return {
            "acc": acc / len(items),
            "acc_norm": acc_norm / len(items),
            "n": len(items),
            "chance": sum(1 / len(i["choices"]) for i in items) / len(items),
        }
    requests = [(encode(item["context"]), encode(item["target"])) for item in items]
    scores = loglikelihoods(model, requests, max_len, batch_size, device)
    if kind == "cloze":
        ppl = [math.exp(-s / len(r[1])) for (s, _), r in zip(scores, requests)]
        return {"acc": sum(g for _, g in scores) / len(items), "ppl": sum(ppl) / len(ppl), "n": len(items)}
    if kind == "exact_match":
        return {"exact_match": sum(g for _, g in scores) / len(items), "n": len(items)}
    nll = -sum(s for s, _ in scores)
    n_tokens = sum(len(r[1]) for r in requests)
    n_bytes = sum(len(item["target"].encode("utf-8")) for item in items)
    return {"loss": nll / n_tokens, "bits_per_byte": nll / math.log(2) / n_bytes, "n": len(items)}


# A task's headline number, for summaries and the comparison table.
PRIMARY_METRIC = {"multiple_choice": "acc_norm", "cloze": "acc", "exact_match": "exact_match", "loss": "loss"}
