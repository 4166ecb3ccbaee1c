"""`python -m nvfp4train.export run_dir=RUN [step=N] [out=DIR] [dtype=float32|bfloat16] [weights=nvfp4_packed]
[overwrite=true]`.

Writes a Hugging Face model directory from any checkpoint of a run (one process, DDP, FSDP2's per-rank
DCP shards, DeepSpeed ZeRO), loadable with `transformers` >= 5.15 as `NemotronHForCausalLM`:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("runs/exp/bf16/export/step_00001000")
    tokenizer = AutoTokenizer.from_pretrained("runs/exp/bf16/export/step_00001000")

The directory holds
  config.json              Nemotron-H's config (model_type `nemotron_h`, `hybrid_override_pattern` with the
                           run's M / * / - blocks) and, under the key `nvfp4train`, the run's model config,
                           step, tokens, training precision and source checkpoint;
  model.safetensors        the weights under Nemotron-H's names (attention's fused qkv split into
                           q_proj / k_proj / v_proj, MLP fc1 / fc2 as up_proj / down_proj);
  tokenizer.json, tokenizer_config.json, special_tokens_map.json
                           the run's `tokenizers` tokenizer with <|endoftext|> as eos, bos and pad token.
`load_export` reads it back into nvfp4train's own model. Only model weights are exported (no optimizer
state); the quantized training linears become plain ones (the paper evaluates in BF16).

weights=nvfp4_packed (a run trained with precision.format=nvfp4): the linears of its NVFP4 blocks are stored as
the NVFP4 weights training used, packed in compressed-tensors' `nvfp4-pack-quantized` format (uint8 codes, E4M3
block scales, FP32 global scale) with config.json's `quantization_config` for vLLM; everything else is written
as with weights=dense (export_nvfp4.py; needs the `serve` extra).

The export's directory and files are readable as the user's umask allows (0755 / 0644 under umask 022), as
`cp` or `tar` leave them, so that another user or job on a shared file system can load them.

Models with rotary position embeddings (model.rope=true, e.g. transformer_1p2b) have no Nemotron-H
equivalent and are refused. Bad input ends with one line and exit code 2, with nothing written; an
existing export is replaced only with overwrite=true, and then only the files an export writes
(EXPORT_FILES): what else is there (a model card README.md, an adapter) is kept, and said so. A target
that is a symbolic link is refused. SIGTERM or Ctrl-C during the export removes its temporary directory
and exits 143 or 130 with one line. Options: configs/export.yaml.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import torch

from nvfp4train.config import ConfigError, help_requested, load, usage
from nvfp4train.eval.weights import RunError, load_run_model, model_config_for

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
WEIGHTS = ("dense", "nvfp4_packed")
ARCHITECTURE = "NemotronHForCausalLM"
MODEL_TYPE = "nemotron_h"
# transformers' Nemotron-H clamps dt from below at time_step_min (default 1e-3), which trained models
# go under (1.6e-4 seen in a 60-step run: logits 5.5e-3 off); nvfp4train never clamps. 0 itself is
# refused by the config's dt initialization (log of time_step_min), so: a floor no real dt reaches.
TIME_STEP_MIN = 1e-12
# Renames of one block's mixer tensors, nvfp4train -> transformers (Mamba's keep their names).
# Tensors outside the blocks: ours -> Nemotron-H's.
TOP_LEVEL_NAMES = {
    "embedding.weight": "model.embeddings.weight",
    "final_norm.weight": "model.norm_f.weight",
    "lm_head.weight": "lm_head.weight",
}
MIXER_RENAMES = {"out.weight": "o_proj.weight", "fc1.weight": "up_proj.weight", "fc2.weight": "down_proj.weight"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Every file an export writes, in the order overwrite=true replaces them (config.json, which marks the
# directory as an export, last); nothing else in an export directory is export's to replace or delete.
EXPORT_FILES = ("model.safetensors", *TOKENIZER_FILES, "generation_config.json", "config.json")


class ExportStopped(BaseException):
    """SIGTERM or SIGINT arrived during the export (a BaseException, as KeyboardInterrupt is)."""

    def __init__(self, signum: int, written: Path | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.written = signum, written  # written: the export was complete when it arrived


class _StopOnSignals:
    """SIGTERM / SIGINT raise ExportStopped, so that the temporary directory is removed on the way out;
    within `deferred()` (the replacement of an existing export's files) a signal waits until its end."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self.deferring = False
        self.previous = {}

    def _handle(self, signum, frame):
        if self.received is not None:
            return  # one is enough: the cleanup that runs next must not be interrupted
        self.received = signum
        if not self.deferring:
            raise ExportStopped(signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    @contextlib.contextmanager
    def deferred(self, out: Path | None = None):
        """A signal inside waits until the block's end, then stops the export (out: what the block wrote)."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.received is not None:
            raise ExportStopped(self.received, written=out)


def hf_config(model_config: dict, eos_id: int, max_positions: int, dtype: str) -> dict:
    """config.json of NemotronHForCausalLM for one of our model configs (rope=false)."""
    m = model_config
    d_inner = m["mamba_expand"] * m["d_model"]
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": m["vocab_size"],
        "hidden_size": m["d_model"],
        "intermediate_size": m["ffn_hidden"],
        "hybrid_override_pattern": m["pattern"],
        "num_attention_heads": m["n_heads"],
        "num_key_value_heads": m["n_kv_heads"],
        "head_dim": m["head_dim"],
        "attention_bias": False,
        "mlp_bias": False,
        "use_bias": False,
        "mlp_hidden_act": "relu2",
        "ssm_state_size": m["mamba_state"],
        "mamba_num_heads": d_inner // m["mamba_head_dim"],
        "mamba_head_dim": m["mamba_head_dim"],
        "n_groups": m["mamba_groups"],
        "expand": m["mamba_expand"],
        "conv_kernel": m["mamba_conv"],
        "chunk_size": m["mamba_chunk"],
        "use_conv_bias": True,
        "mamba_hidden_act": "silu",
        "time_step_min": TIME_STEP_MIN,
        "layer_norm_epsilon": m["norm_eps"],
        "residual_in_fp32": False,
        "tie_word_embeddings": False,
        "initializer_range": m["init_std"],
        "max_position_embeddings": max_positions,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "use_cache": True,
        "dtype": dtype,
    }


def to_hf_state(state: dict[str, torch.Tensor], model_config: dict) -> dict[str, torch.Tensor]:
    """nvfp4train's state dict -> Nemotron-H's tensor names (qkv split by rows)."""
    q_rows = model_config["n_heads"] * model_config["head_dim"]
    kv_rows = model_config["n_kv_heads"] * model_config["head_dim"]
    out = {}
    for name, tensor in state.items():
        if name in TOP_LEVEL_NAMES:
            out[TOP_LEVEL_NAMES[name]] = tensor
        elif name.startswith("blocks."):
            _, index, rest = name.split(".", 2)
            prefix = f"model.layers.{index}."
            if rest == "mixer.qkv.weight":
                q, k, v = tensor.split([q_rows, kv_rows, kv_rows], dim=0)
                out.update(
                    {
                        prefix + "mixer.q_proj.weight": q,
                        prefix + "mixer.k_proj.weight": k,
                        prefix + "mixer.v_proj.weight": v,
                    }
                )
            elif rest.startswith("mixer."):
                out[prefix + "mixer." + MIXER_RENAMES.get(rest[6:], rest[6:])] = tensor
            else:
                out[prefix + rest] = tensor
        else:
            raise ValueError(f"no Nemotron-H name for the model tensor {name!r}")
    return {k: v.contiguous() for k, v in out.items()}


def from_hf_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `to_hf_state`."""
    back = {v: k for k, v in MIXER_RENAMES.items()}
    top_level = {v: k for k, v in TOP_LEVEL_NAMES.items()}
    out, qkv = {}, {}
    for name, tensor in state.items():
        if name in top_level:
            out[top_level[name]] = tensor
        else:
            index, rest = name[len("model.layers.") :].split(".", 1)
            if rest in ("mixer.q_proj.weight", "mixer.k_proj.weight", "mixer.v_proj.weight"):
                qkv.setdefault(index, {})[rest[6]] = tensor
            elif rest.startswith("mixer."):
                out[f"blocks.{index}.mixer." + back.get(rest[6:], rest[6:])] = tensor
            else:
                out[f"blocks.{index}.{rest}"] = tensor
    for index, parts in qkv.items():
        out[f"blocks.{index}.mixer.qkv.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return out


def write_tokenizer(tokenizer_setting: str, out: Path, max_length: int) -> tuple[dict, int]:
    """The run's tokenizer as transformers' fast-tokenizer files; returns (its description for config.json,
    its end-of-text id).

    The file named by the run's config is loaded as a tokenizer and written anew from the loaded object,
    never copied: whatever else that path holds does not reach the export."""
    from nvfp4train.data import load_tokenizer
    from nvfp4train.data.tokenizer import EOS_TOKEN, HFTokenizer

    try:
        tokenizer = load_tokenizer(tokenizer_setting)
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise RunError(f"data.tokenizer={tokenizer_setting!r}: {e}") from None
    if not isinstance(tokenizer, HFTokenizer):
        return {
            "source": tokenizer_setting,
            "exported": False,
            "why": "a tiktoken tokenizer: load GPT-2's tokenizer with AutoTokenizer instead",
        }, tokenizer.eos_id
    tokenizer.save(out / "tokenizer.json")
    special = {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN, "unk_token": None}
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                **special,
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": max_length,
            },
            indent=1,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({k: v for k, v in special.items() if v is not None}, indent=1) + "\n"
    )
    return {"source": tokenizer_setting, "exported": True, "identity": tokenizer.identity}, tokenizer.eos_id


def _check_out(out: Path, overwrite: bool) -> None:
    """An existing output directory is replaced only when asked, and only if it is an export."""
    if out.is_symlink():
        raise RunError(
            f"out={str(out)!r} is a symbolic link (to {os.readlink(out)}); an export directory must be its "
            "own: remove the link or choose another out"
        )
    if not out.exists():
        return
    if not out.is_dir():
        raise RunError(f"out={str(out)!r}: exists and is not a directory")
    if not any(out.iterdir()):
        return
    if not overwrite:
        raise RunError(f"out={str(out)!r}: already exists; pass overwrite=true to replace it")
    try:
        config = json.loads((out / "config.json").read_text())
        is_export = config.get("model_type") == MODEL_TYPE and "nvfp4train" in config
    except (OSError, ValueError, AttributeError):
        is_export = False
    if not is_export:
        raise RunError(
            f"out={str(out)!r}: exists and is not an nvfp4train export; not replaced, even with overwrite=true"
        )


def export(
    run_dir: Path,
    step: int | None = None,
    out: Path | None = None,
    dtype: str = "float32",
    overwrite: bool = False,
    weights: str = "dense",
) -> Path:
    """Write the Hugging Face model directory of the run's checkpoint; return its path."""
    if dtype not in DTYPES:
        raise RunError(f"dtype={dtype!r}: allowed: {', '.join(DTYPES)}")
    if weights not in WEIGHTS:
        raise RunError(f"weights={weights!r}: allowed: {', '.join(WEIGHTS)}")
    if weights == "nvfp4_packed":
        from nvfp4train.export_nvfp4 import require_compressed_tensors

        require_compressed_tensors()
    if not isinstance(overwrite, bool):
        raise RunError(f"overwrite={overwrite!r}: allowed: true, false")
    model, run_config, ckpt = load_run_model(Path(run_dir), step)
    model_config = model_config_for(run_config)
    if model_config.get("rope"):
        raise RunError(
            f"{Path(run_dir) / 'config.yaml'}: model.rope=true: a Transformer with rotary embeddings "
            "has no Nemotron-H equivalent in transformers; only rope=false models are exported"
        )
    meta = json.loads((ckpt / "meta.json").read_text())
    if not out and (Path(run_dir) / "export").is_symlink():  # never written through a link in the run directory
        raise RunError(
            f"{Path(run_dir) / 'export'} is a symbolic link; a run directory's files must be its own: remove it "
            "or pass out=DIR"
        )
    out = Path(out) if out else Path(run_dir) / "export" / ckpt.name
    _check_out(out, overwrite)

    seq_len = int(run_config.get("train", {}).get("seq_len") or 4096)
    with _StopOnSignals() as stop:
        packed = None
        if weights == "nvfp4_packed":  # refused here, before anything is written, where it cannot apply
            from nvfp4train.export_nvfp4 import pack_linears

            packed = pack_linears(model, Path(run_dir), run_config, meta)
        tmp = None
        try:
            # moved into place when complete; a signal while it is made waits until `tmp` names it (then the
            # `finally` below removes it: a signal inside mkdtemp would leave it behind)
            with stop.deferred():
                try:
                    out.parent.mkdir(parents=True, exist_ok=True)
                    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
                except OSError as e:
                    raise RunError(f"out={str(out)!r}: cannot write there ({e.strerror})") from None
            _write_export(tmp, model, run_config, model_config, meta, ckpt, dtype, seq_len, packed)
            _make_readable(tmp)
            with stop.deferred(out):
                kept = _move_into_place(tmp, out)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    if kept:
        print(
            f"{out}: kept {', '.join(kept)} (not written by export); replaced only "
            f"{', '.join(n for n in EXPORT_FILES if (out / n).exists())}",
            file=sys.stderr,
        )
    return out


def _write_export(
    tmp: Path, model, run_config: dict, model_config: dict, meta: dict, ckpt: Path, dtype, seq_len, packed=None
):
    """`packed`: pack_linears' (NVFP4 linears, linears kept dense) for weights=nvfp4_packed, else None."""
    from safetensors.torch import save_file

    tokenizer_info, eos_id = write_tokenizer(str(run_config.get("data", {}).get("tokenizer", "")), tmp, seq_len)
    state = {k: v.detach().to(DTYPES[dtype]) for k, v in model.state_dict().items() if not packed or k not in packed[0]}
    hf_state = to_hf_state(state, model_config)
    if packed:
        from nvfp4train.export_nvfp4 import packed_state

        hf_state.update(packed_state(packed[0], model_config))
    save_file(hf_state, str(tmp / "model.safetensors"), metadata={"format": "pt", "step": str(meta["step"])})
    config = hf_config(model_config, eos_id, seq_len, dtype)
    if packed:
        from nvfp4train.export_nvfp4 import ignored_modules, quantization_config

        config["quantization_config"] = quantization_config(ignored_modules(packed[1]))
    config["nvfp4train"] = {
        "model": model_config,
        "step": meta["step"],
        "tokens": meta.get("tokens"),
        "training_precision": run_config.get("precision", {}).get("name"),
        "seq_len": seq_len,
        "tokenizer": tokenizer_info,
        "source_checkpoint": str(ckpt),
        "engine": meta.get("engine", "torch"),
        "world_size": meta.get("world_size"),
        "weights": "nvfp4_packed" if packed else "dense",
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id}, indent=1) + "\n"
    )


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read it: set and restore (the export is single-threaded)
    os.umask(mask)
    return mask


def _make_readable(tmp: Path) -> None:
    """The temporary directory (mkdtemp: 0700) and the files written into it as a new directory and new files
    are under the user's umask (0755 / 0644 under umask 022). Only what this export created in its own
    temporary directory is touched, and a symbolic link there (none is written) is never followed."""
    mask = _umask()
    for path in tmp.iterdir():
        if not path.is_symlink() and path.is_file():
            os.chmod(path, 0o666 & ~mask)
    os.chmod(tmp, 0o777 & ~mask)


def _move_into_place(tmp: Path, out: Path) -> list[str]:
    """The complete export in `tmp` becomes `out`: renamed whole when `out` is new (or empty), else file by
    file (each a rename: a link there is replaced, never written through), removing the export files this
    export does not write. Returns the names in `out` that are not export's, all left as they were."""
    if not out.exists() or not any(out.iterdir()):
        if out.exists():
            out.rmdir()
        tmp.rename(out)
        return []
    for name in EXPORT_FILES:
        if (tmp / name).exists():
            os.replace(tmp / name, out / name)
        elif os.path.lexists(out / name) and not (out / name).is_dir():
            os.unlink(out / name)  # an older export's tokenizer file, say: not this export's
    return sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir() if p.name not in EXPORT_FILES)


def load_export(path: Path):
    """An export read back as nvfp4train's HybridLM (plain linears, FP32) and its config.json."""
    from safetensors.torch import load_file

    from nvfp4train.model import build_model

    config = json.loads((Path(path) / "config.json").read_text())
    model = build_model(config["nvfp4train"]["model"])
    state = load_file(str(Path(path) / "model.safetensors"))
    if "quantization_config" in config:  # weights=nvfp4_packed: its NVFP4 linears dequantized in FP32
        from nvfp4train.export_nvfp4 import dense_from_packed

        state = dense_from_packed(state)
    model.load_state_dict({k: v.float() for k, v in from_hf_state(state).items()})
    return model.eval(), config


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if help_requested(argv):
        print(usage("export", __doc__))
        return 0
    try:
        cfg = load("export", argv)
        out = export(cfg.run_dir, cfg.step, cfg.out, str(cfg.dtype), cfg.overwrite, str(cfg.weights))
    except (ConfigError, RunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ExportStopped as e:
        done = f"once complete: {e.written} is written" if e.written else "nothing written"
        print(f"error: export stopped by {e}: {done} (its temporary directory removed)", file=sys.stderr)
        return 128 + e.signum
    config = json.loads((out / "config.json").read_text())
    print(
        json.dumps(
            {
                "out": str(out),
                "step": config["nvfp4train"]["step"],
                "dtype": config["dtype"],
                "weights": config["nvfp4train"]["weights"],
                "architecture": ARCHITECTURE,
                "tokenizer": config["nvfp4train"]["tokenizer"]["exported"],
                "bytes": (out / "model.safetensors").stat().st_size,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
