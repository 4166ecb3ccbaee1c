"""`python -m nvfp4train.export weights=nvfp4_packed`: an NVFP4 run's quantized linears in compressed-tensors'
`nvfp4-pack-quantized` format, checked against our own quantizer (recomputed here from the checkpoint with
`formats.nvfp4.quantize`, not through the export's code), the compressed-tensors library's decompression and
transformers on CPU; and the export's files readable as the umask allows."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from nvfp4train.eval import load_run_model
from nvfp4train.export import load_export, main
from nvfp4train.export_nvfp4 import LINEAR_WEIGHT, PACKED_SUFFIXES
from nvfp4train.formats import nvfp4
from nvfp4train.precision import PrecisionPolicy
from tests.conftest import REPO, cli_env, run_train
from tests.eval.conftest import TINY

compressed_tensors = pytest.importorskip("compressed_tensors")

# hybrid_tiny ("M-*-M-") under the nvfp4 preset: bf16_last 0.13 of 6 blocks keeps block 5 (an MLP) in BF16.
HF_LINEARS = {  # our linear -> its Nemotron-H modules
    "in_proj": ["in_proj"],
    "out_proj": ["out_proj"],
    "qkv": ["q_proj", "k_proj", "v_proj"],
    "out": ["o_proj"],
    "fc1": ["up_proj"],
    "fc2": ["down_proj"],
}


@pytest.fixture(scope="module")
def nvfp4_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ct") / "nvfp4"
    run_train(f"out_dir={out}", "precision=nvfp4", *TINY)
    return out


@pytest.fixture(scope="module")
def packed_export(nvfp4_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("ct") / "export"
    assert main([f"run_dir={nvfp4_run}", f"out={out}", "weights=nvfp4_packed"]) == 0
    return out


def our_quantized_linears(run_dir):
    """{our weight name: (its NVFP4Tensor, the Nemotron-H modules it becomes)} for the linears the recipe ran in
    NVFP4: the FP32 master weight quantized with the recipe's 16x16 tiles, rows zero-padded to a whole tile as
    training pads them (Mamba's in_proj has 648 rows), then cropped."""
    model, config, _ = load_run_model(run_dir)
    policy = PrecisionPolicy.from_dict(config["precision"])
    n_blocks = len(config["model"]["pattern"])
    assert policy.resolved_weight_tile == "16x16"
    out = {}
    for name, w in model.state_dict().items():
        match = LINEAR_WEIGHT.fullmatch(name)
        if match and not policy.is_bf16_block(int(match.group(1)), n_blocks):
            rows = w.shape[0]
            q = nvfp4.quantize(torch.nn.functional.pad(w, (0, 0, 0, -rows % 16)), (16, 16))
            q = nvfp4.NVFP4Tensor(q.codes[:rows], q.scales[:rows], q.amax, q.global_decode_scale, w.shape, q.tile)
            modules = [f"model.layers.{match.group(1)}.mixer.{m}" for m in HF_LINEARS[match.group(2)]]
            out[name] = (q, modules)
    return model, out


def split_rows(tensor, n_parts, config):
    """qkv's rows as q, k, v (one part: the tensor)."""
    if n_parts == 1:
        return [tensor]
    q = config["n_heads"] * config["head_dim"]
    kv = config["n_kv_heads"] * config["head_dim"]
    return list(tensor.split([q, kv, kv]))


def test_packed_tensors_are_the_bits_of_our_nvfp4_weights(nvfp4_run, packed_export):
    model, quantized = our_quantized_linears(nvfp4_run)
    config = json.loads((packed_export / "config.json").read_text())
    state = load_file(str(packed_export / "model.safetensors"))
    assert len(quantized) == 10  # blocks 0-4 ("M-*-M"): two linears each
    for q, modules in quantized.values():
        codes = split_rows(q.codes, len(modules), config["nvfp4train"]["model"])
        scales = split_rows(q.scales, len(modules), config["nvfp4train"]["model"])
        for module, c, s in zip(modules, codes, scales):
            assert f"{module}.weight" not in state, module
            assert state[f"{module}.weight_packed"].dtype == torch.uint8
            assert torch.equal(state[f"{module}.weight_packed"], c), module  # same nibbles, same order
            assert state[f"{module}.weight_scale"].dtype == torch.float8_e4m3fn
            assert torch.equal(state[f"{module}.weight_scale"].view(torch.uint8), s.view(torch.uint8)), module
            encode = state[f"{module}.weight_global_scale"]
            assert encode.dtype == torch.float32 and encode.shape == (1,)
            assert torch.equal(encode[0], nvfp4.global_encode_scale(q.amax))  # the encode scale, 2688 / amax
            assert torch.equal(torch.reciprocal(encode[0]), q.global_decode_scale)  # vLLM's 1 / it: our s_dec
    # Everything else as it was trained: block 5's MLP, the embedding, the head, norms, Mamba's conv / A / D.
    expected = model.state_dict()
    assert torch.equal(state["model.layers.5.mixer.up_proj.weight"], expected["blocks.5.mixer.fc1.weight"])
    assert torch.equal(state["model.layers.5.mixer.down_proj.weight"], expected["blocks.5.mixer.fc2.weight"])
    assert torch.equal(state["model.embeddings.weight"], expected["embedding.weight"])
    assert torch.equal(state["lm_head.weight"], expected["lm_head.weight"])
    assert torch.equal(state["model.layers.0.mixer.A_log"], expected["blocks.0.mixer.A_log"])
    assert torch.equal(state["model.layers.0.mixer.conv1d.weight"], expected["blocks.0.mixer.conv1d.weight"])


def test_library_decompression_equals_our_dequantization_bit_for_bit(nvfp4_run, packed_export):
    """compressed-tensors decompresses to BF16 (e2m1 x scale / global scale, rounded once to BF16):
    the same BF16 numbers as our NVFP4Tensor.dequantize(bfloat16) (e2m1 x scale x s_dec, rounded once)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig

    _, quantized = our_quantized_linears(nvfp4_run)
    config = json.loads((packed_export / "config.json").read_text())
    qconfig = QuantizationConfig.model_validate(config["quantization_config"])
    compressor = BaseCompressor.get_value_from_registry(qconfig.format)
    scheme = qconfig.config_groups["group_0"]
    state = load_file(str(packed_export / "model.safetensors"))
    for q, modules in quantized.values():
        parts = [compressor.decompress({s: state[f"{m}.{s}"] for s in PACKED_SUFFIXES}, scheme) for m in modules]
        decompressed = torch.cat([p["weight"] for p in parts])
        ours = q.dequantize(torch.bfloat16, impl="reference")
        assert decompressed.dtype == torch.bfloat16 and decompressed.shape == ours.shape
        assert torch.equal(decompressed.view(torch.int16), ours.view(torch.int16)), modules


def fake_quantized_model(run_dir):
    """Our model with each NVFP4 linear's weight replaced by its dequantized BF16 numbers (as FP32)."""
    model, quantized = our_quantized_linears(run_dir)
    with torch.no_grad():
        for name, (q, _) in quantized.items():
            model.get_parameter(name).copy_(q.dequantize(torch.bfloat16, impl="reference").float())
    return model


def test_transformers_logits_equal_ours_with_those_weights(nvfp4_run, packed_export):
    transformers = pytest.importorskip("transformers")
    if tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 15):
        pytest.skip(f"transformers {transformers.__version__} < 5.15 has no correct Nemotron-H")
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    ours = fake_quantized_model(nvfp4_run)
    ids = torch.randint(0, 8192, (2, 150), generator=torch.Generator().manual_seed(0))  # beyond one 64-token chunk
    with torch.no_grad():
        expected = ours(ids)
    hf = AutoModelForCausalLM.from_pretrained(
        packed_export, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)
    ).eval()
    assert type(hf).__name__ == "NemotronHForCausalLM"
    with torch.no_grad():
        diff = (hf(ids).logits - expected).abs().max().item()
    assert diff <= 1e-5, diff  # FP32 on both sides, the same weights: summation order only (4.8e-7 measured)
    # transformers' default route keeps the layers compressed and decompresses them to BF16 on the first
    # forward; it then needs a BF16 model (dtype=float32 stops with a dtype mismatch inside F.linear).
    hf_bf16 = AutoModelForCausalLM.from_pretrained(packed_export, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        logits = hf_bf16(ids).logits.float()
    assert (logits - expected).abs().max().item() <= 0.05 * expected.abs().max().item()


def test_quantization_config_is_what_vllm_reads(packed_export, capsys):
    """vLLM's compressed-tensors loader reads quant_method, format, config_groups.*.{targets, weights,
    input_activations} and ignore; weights 4-bit float, tensor_group strategy, group_size 16, symmetric,
    static, no input_activations = its W4A16 NVFP4 scheme (CompressedTensorsW4A16Fp4)."""
    config = json.loads((packed_export / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "nvfp4-pack-quantized"
    assert qc["quantization_status"] == "compressed" and qc["version"] == compressed_tensors.__version__
    group = qc["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"] and group["format"] == "nvfp4-pack-quantized"
    assert group["input_activations"] is None and group["output_activations"] is None
    w = group["weights"]
    assert (w["num_bits"], w["type"], w["strategy"], w["group_size"]) == (4, "float", "tensor_group", 16)
    assert w["symmetric"] is True and w["dynamic"] is False
    assert qc["ignore"] == ["lm_head", "model.layers.5.mixer.up_proj", "model.layers.5.mixer.down_proj"]
    assert config["nvfp4train"]["weights"] == "nvfp4_packed" and config["nvfp4train"]["training_precision"] == "nvfp4"


def test_load_export_reads_a_packed_export_as_the_fp32_dequantized_weights(nvfp4_run, packed_export):
    model, quantized = our_quantized_linears(nvfp4_run)
    exported, _ = load_export(packed_export)
    state = exported.state_dict()
    for name, tensor in model.state_dict().items():
        expected = quantized[name][0].dequantize(torch.float32, impl="reference") if name in quantized else tensor
        assert torch.equal(state[name], expected), name


def edited_run(tmp_path, run_dir, old, new):
    """A run directory whose config.yaml says `new` where the run's says `old` (same checkpoints)."""
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "checkpoints").symlink_to(run_dir / "checkpoints")
    config = (run_dir / "config.yaml").read_text()
    assert old in config, old
    (edited / "config.yaml").write_text(config.replace(old, new, 1))
    return edited


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("rht: wgrad", "rht: all", "precision.rht='all': the weights were quantized after a Hadamard rotation"),
        ("sr: grads", "sr: all", "precision.sr='all': the weights were stochastically rounded afresh"),
        (
            "at_fraction: null",
            "at_fraction: 0.5",
            "precision.switch: the forward switched to BF16 at 0.5 of the tokens, before this checkpoint (step 4)",
        ),
    ],
)
def test_recipes_without_one_packed_weight_are_refused_in_one_line(nvfp4_run, tmp_path, capsys, old, new, says):
    run_dir = edited_run(tmp_path, nvfp4_run, old, new)
    assert main([f"run_dir={run_dir}", f"out={tmp_path / 'x'}", "weights=nvfp4_packed"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: weights=nvfp4_packed: {run_dir / 'config.yaml'}: ")
    assert says in err and "; export with weights=dense" in err, err
    assert not (tmp_path / "x").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_linears_precision_modules_kept_in_another_format_are_exported_dense(nvfp4_run, tmp_path):
    """A run whose precision.modules put the Mamba in_proj layers in BF16 and block 2's attention in FP8 (as its
    config.yaml records the presets: their keys) exports those dense, as trained, and packs the other NVFP4 ones."""
    modules = "modules:\n    '*.in_proj': {name: bf16}\n    blocks.2.*: {name: fp8_blockwise, format: fp8_blockwise}"
    run_dir = edited_run(tmp_path, nvfp4_run, "modules: {}", modules)
    assert main([f"run_dir={run_dir}", f"out={tmp_path / 'x'}", "weights=nvfp4_packed"]) == 0
    state, (model, _, _) = load_file(str(tmp_path / "x" / "model.safetensors")), load_run_model(nvfp4_run)
    expected = model.state_dict()
    for i in (0, 4):  # the Mamba blocks of "M-*-M-"
        assert torch.equal(
            state[f"model.layers.{i}.mixer.in_proj.weight"], expected[f"blocks.{i}.mixer.in_proj.weight"]
        )
        assert f"model.layers.{i}.mixer.out_proj.weight_packed" in state
    assert torch.equal(state["model.layers.2.mixer.o_proj.weight"], expected["blocks.2.mixer.out.weight"])
    assert "model.layers.3.mixer.up_proj.weight_packed" in state


def test_a_bf16_run_is_refused_in_one_line(tiny_run, tmp_path, capsys):
    assert main([f"run_dir={tiny_run}", f"out={tmp_path / 'x'}", "weights=nvfp4_packed"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: weights=nvfp4_packed: {tiny_run / 'config.yaml'}: precision.format='bf16': only a run trained in "
        "NVFP4 (precision.format=nvfp4) has NVFP4 weights to pack; export this one with weights=dense"
    )
    assert not (tmp_path / "x").exists()
    assert main([f"run_dir={tiny_run}", f"out={tmp_path / 'x'}", "weights=fp4"]) == 2
    assert capsys.readouterr().err.strip() == "error: weights='fp4': allowed dense, nvfp4_packed"


def test_without_compressed_tensors_one_line_names_the_extra(nvfp4_run, tmp_path):
    """The library made unimportable in the child (a None entry in sys.modules is what `import` refuses)."""
    code = (
        "import sys; sys.modules['compressed_tensors'] = None\n"
        "from nvfp4train.export import main\n"
        f"sys.exit(main(['run_dir={nvfp4_run}', 'out={tmp_path / 'x'}', 'weights=nvfp4_packed']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "error: weights=nvfp4_packed needs the compressed-tensors library: pip install 'nvfp4train[serve]'"
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_export_is_readable_as_the_umask_allows(tiny_run, tmp_path, umask):
    """A new export directory and its files get 0777 / 0666 less the umask (as cp or tar give them), also when
    overwrite=true replaces the files of an existing export."""
    previous = os.umask(umask)
    try:
        out = tmp_path / "export"
        assert main([f"run_dir={tiny_run}", f"out={out}"]) == 0
        assert (out.stat().st_mode & 0o777) == 0o777 & ~umask
        files = sorted(p.name for p in out.iterdir())
        assert "model.safetensors" in files and "config.json" in files
        for p in out.iterdir():
            assert (p.stat().st_mode & 0o777) == 0o666 & ~umask, (p.name, oct(p.stat().st_mode))
        (out / "model.safetensors").chmod(0o600)
        assert main([f"run_dir={tiny_run}", f"out={out}", "overwrite=true"]) == 0
        assert ((out / "model.safetensors").stat().st_mode & 0o777) == 0o666 & ~umask
    finally:
        os.umask(previous)
