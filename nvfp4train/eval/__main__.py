"""`python -m nvfp4train.eval run_dir=RUN [step=N] [tasks=...] [eval_precision=bf16|train|both]`: evaluate a
checkpoint in BF16 (and, on request, its held-out loss in the training precision).

Loads the checkpoint (any engine or sharding) into the run's model built with plain linears, as the
paper evaluates in BF16, then measures
  - held-out loss and perplexity on the validation split of every data source of the run's config
    (`heldout`); eval_precision=train measures it in the run's training precision instead, and both
    measures it in both (`heldout` in BF16, `heldout_tp` in the training precision): the run's model built
    with its precision policy's linears, in the precision of the checkpoint's step (BF16 after a full
    switch, which is then not evaluated twice);
  - the offline zero-shot tasks of evals/tasks.yaml (scoring: nvfp4train/eval/harness.py), in BF16.
Writes `<run_dir>/eval.json` and prints its summary as JSON on the last line. Bad input (no
checkpoint, a checkpoint of another model, an unknown task or key) ends with one line and exit code 2,
before anything is written. Options: configs/eval.yaml.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from nvfp4train.config import ConfigError, EvalConfig, help_requested, load, usage
from nvfp4train.eval import harness
from nvfp4train.eval.weights import RunError, load_run_model, pick_device, read_run_config

EVAL_READS = {"model": (), "train": ("seq_len",), "data": ("tokenizer",)}  # of the run's config.yaml


def evaluate(cfg: EvalConfig) -> tuple[dict, Path]:
    """Run the evaluation described by an eval config; return (eval.json contents, its path).

    A run trained with train.deterministic=true is evaluated in the same deterministic mode on a GPU (mamba-ssm's
    kernels pinned instead of autotuned by timing, cuBLAS's fixed workspace), so that evaluating it twice, or
    evaluating a bitwise replicate of it, gives the same eval.json; otherwise the last digits can differ."""
    from nvfp4train.train.determinism import deterministic_mode
    from nvfp4train.train.rundir import check_own, write_atomic

    # every section the evaluation reads, checked before a model is built or a checkpoint loaded
    run_config = read_run_config(cfg.run_dir, required=EVAL_READS)
    path = cfg.run_dir / "eval.json"
    check_own(path)  # never written through a link (or a second hard link) left in the run directory
    if not os.access(cfg.run_dir, os.W_OK | os.X_OK):  # said now, not after the whole evaluation ran
        raise RunError(f"{path}: cannot be written ({cfg.run_dir} is not writable); nothing was evaluated")
    device = pick_device(cfg.device)
    deterministic = device == "cuda" and bool(run_config["train"].get("deterministic"))
    with deterministic_mode(deterministic):
        result = _evaluate(cfg, device)
    result["deterministic"] = deterministic
    write_atomic(path, json.dumps(result, indent=1) + "\n")
    return result, path


def _evaluate(cfg: EvalConfig, device: str) -> dict:
    run_dir = cfg.run_dir
    max_items = cfg.max_items or None
    definitions = harness.load_task_definitions()
    names = harness.select_tasks(cfg.tasks, definitions)
    task_items = {name: harness.read_items(definitions[name])[:max_items] for name in names}

    t0 = time.perf_counter()
    model, run_config, ckpt = load_run_model(run_dir, cfg.step, device)
    from nvfp4train.data import build_val_data, load_tokenizer

    seq_len = int(run_config["train"]["seq_len"])
    try:
        val_data = build_val_data(run_config["data"], seq_len=seq_len, max_sequences_per_domain=cfg.heldout_sequences)
        tokenizer = load_tokenizer(run_config["data"]["tokenizer"])
    except (ValueError, FileNotFoundError) as e:
        raise RunError(f"{run_dir / 'config.yaml'}: data: {e}") from None
    val_data = {source: seqs.to(device) for source, seqs in val_data.items()}  # once, for every pass over them

    heldout, in_training_precision = None, None
    progress(f"held-out loss ({cfg.eval_precision}, up to {cfg.heldout_sequences} sequences of {', '.join(val_data)})")
    if cfg.eval_precision != "train":
        heldout = harness.heldout_losses(model, val_data, cfg.batch_size, device)
    if cfg.eval_precision != "bf16":
        quantized, trained_in = harness.in_training_precision(model, run_config, ckpt, device)
        if heldout is not None and trained_in["runs_in_bf16"]:  # the same GEMMs: measured once
            in_training_precision = heldout
        else:
            in_training_precision = harness.heldout_losses(quantized, val_data, cfg.batch_size, device)
        del quantized
    tasks = {}
    for i, name in enumerate(names, 1):
        spec = definitions[name]
        progress(f"task {name} ({i}/{len(names)}, {len(task_items[name])} items)")
        scores = harness.score_task(model, tokenizer, spec, task_items[name], seq_len, cfg.batch_size, device)
        tasks[name] = {"kind": spec["kind"], "primary": harness.PRIMARY_METRIC[spec["kind"]], **scores}
    meta = json.loads((ckpt / "meta.json").read_text())
    mean = lambda losses: sum(v["loss"] for v in losses.values()) / len(losses)  # noqa: E731
    result = {
        "run_dir": str(run_dir),
        "checkpoint": str(ckpt),
        "step": int(meta["step"]),
        "tokens": meta.get("tokens"),
        "precision": run_config.get("precision", {}).get("name"),
        "eval_precision": str(cfg.eval_precision),
        "max_len": seq_len,
        "heldout_sequences": cfg.heldout_sequences,
    }
    if cfg.eval_precision == "train":
        heldout, in_training_precision = in_training_precision, None
    result.update({"heldout": heldout, "heldout_mean_loss": mean(heldout)})
    if in_training_precision is not None:
        result.update({"heldout_tp": in_training_precision, "heldout_tp_mean_loss": mean(in_training_precision)})
    if cfg.eval_precision != "bf16":
        result["training_precision"] = trained_in  # what `heldout_tp` (train: `heldout`) was measured in
    result.update({"tasks": tasks, "tasks_precision": "bf16", "seconds": round(time.perf_counter() - t0, 2)})
    return result


def progress(what: str) -> None:
    """What the evaluation is doing, on stderr as it starts (stdout, the results, may go to a file)."""
    print(f"eval: {what} ...", file=sys.stderr, flush=True)


def summary(result: dict, path: Path) -> dict:
    out = {"eval_json": str(path), "step": result["step"]}
    out.update({f"heldout/{k}": round(v["loss"], 4) for k, v in result["heldout"].items()})
    out.update({f"heldout_tp/{k}": round(v["loss"], 4) for k, v in result.get("heldout_tp", {}).items()})
    out.update({f"{k}/{v['primary']}": round(v[v["primary"]], 4) for k, v in result["tasks"].items()})
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if hasattr(sys.stdout, "reconfigure"):  # each line as it is printed, also into a file or a pipe
        sys.stdout.reconfigure(line_buffering=True)
    if help_requested(argv):
        print(usage("eval", __doc__))
        return 0
    try:
        result, path = evaluate(load("eval", argv))
    except (ConfigError, RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_result(result, path)
    return 0


def print_result(result: dict, path: Path) -> None:
    """The evaluation's lines: held-out loss per source (and precision), each task's metrics, then the summary
    as JSON on the last line."""
    precision = "bf16"
    if result["eval_precision"] != "bf16":
        trained_in = result["training_precision"]
        precision = trained_in["name"] + (f", switched {trained_in['switched']}" if trained_in["switched"] else "")
    both = result["eval_precision"] == "both"
    for source, v in result["heldout"].items():
        print(f"held-out {source:<14} loss {v['loss']:.4f}  ppl {v['ppl']:.1f}  ({'bf16' if both else precision})")
    for source, v in result.get("heldout_tp", {}).items():
        print(f"held-out {source:<14} loss {v['loss']:.4f}  ppl {v['ppl']:.1f}  ({precision})")
    for name, v in result["tasks"].items():
        metrics = "  ".join(
            f"{k} {v[k]:.4f}"
            for k in ("acc", "acc_norm", "exact_match", "ppl", "loss", "bits_per_byte", "chance")
            if k in v
        )
        print(f"task {name:<22} {metrics}  (n={v['n']})")
    print(json.dumps(summary(result, path)))


if __name__ == "__main__":
    sys.exit(main())
