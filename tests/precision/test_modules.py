"""precision.modules: a precision preset per linear by a glob over the model's module names, on top of the run's
policy (the last matching pattern decides a linear, over bf16_first / bf16_last); checked once when the config is
read (one line naming the key and what is allowed), resolved once into each layer's recipe, and shown in the
run's log, plan (train.log, config.yaml's `resolved:`, the first metrics record) and telemetry."""

import json

import pytest
import torch
import yaml

from nvfp4train.config import ConfigError, RunConfig, compose, load
from nvfp4train.config import load_preset as load_section
from nvfp4train.eval import load_run_model
from nvfp4train.eval.harness import in_training_precision
from nvfp4train.model import HybridLM, ModelConfig
from nvfp4train.precision import PrecisionController, PrecisionPolicy, build_linear_factory
from nvfp4train.precision.backends import resolve_backend
from nvfp4train.precision.controller import compact_names
from nvfp4train.precision.layer import PrecisionLinear
from nvfp4train.precision.recipe import LayerRecipe
from nvfp4train.train.loop import run
from nvfp4train.train.resume_policy import check as resume_check

# RMSNorm gets BF16 activations and an FP32 weight under autocast; torch warns it cannot fuse that.
pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")

MODEL = load_section("model", "hybrid_0p5m")  # "M-M-M-*-M-M-": 12 blocks, the last 2 in BF16 under nvfp4


def policy(modules: dict, base: str = "nvfp4", **keys) -> PrecisionPolicy:
    """The base preset with precision.modules naming presets, as a config gives them."""
    presets = {pattern: load_section("precision", name) for pattern, name in modules.items()}
    return PrecisionPolicy.from_dict({**load_section("precision", base), **keys, "modules": presets})


# ------------------------------------------------------------------------------------ resolution per name
def test_the_last_matching_pattern_decides_a_linear_and_others_keep_the_run_policy():
    p = policy({"*.in_proj": "bf16", "blocks.2.*": "fp8_blockwise"})
    assert p.for_module("blocks.0.mixer.in_proj").format == "bf16"
    assert p.for_module("blocks.2.mixer.in_proj").format == "fp8_blockwise"  # both match: the last one
    assert p.for_module("blocks.2.mixer.out_proj").format == "fp8_blockwise"
    assert p.for_module("blocks.0.mixer.out_proj") is p and p.for_module(None) is p
    swapped = policy({"blocks.2.*": "fp8_blockwise", "*.in_proj": "bf16"})
    assert swapped.for_module("blocks.2.mixer.in_proj").format == "bf16"  # the order is the rule
    assert p.module_pattern("blocks.2.mixer.in_proj") == "blocks.2.*"


def test_a_pattern_overrides_the_bf16_blocks_and_runs_its_presets_recipe_with_the_runs_schedule():
    p = policy({"blocks.11.*": "nvfp4", "blocks.0.*": "bf16"}, switch={"at_fraction": 0.8, "mode": "forward_only"})
    n = MODEL["pattern"].__len__()
    assert p.is_bf16_block(11, n)  # nvfp4's last 2 of 12 blocks are BF16 ...
    last = p.for_module("blocks.11.mixer.fc2")
    assert last.layer_recipe(11, n) == p.quantized_recipe() and not last.layer_recipe(11, n).all_bf16  # ... not here
    assert (last.bf16_first, last.bf16_last, last.switch, last.backend) == (0, 0, p.switch, p.backend)
    assert last.layer_recipe(11, n, switched=True) == p.layer_recipe(3, n, switched=True)  # the run's switch
    assert p.for_module("blocks.0.mixer.in_proj").layer_recipe(0, n) == LayerRecipe()
    fp8 = policy({"*.fc1": "fp8_blockwise"}).for_module("blocks.1.mixer.fc1")
    assert (
        fp8.layer_recipe(1, n)
        == PrecisionPolicy.from_dict(load_section("precision", "fp8_blockwise")).quantized_recipe()
    )


def test_the_model_config_names_the_linears_the_model_holds():
    cfg = ModelConfig.from_dict(MODEL)
    factory = build_linear_factory(policy({}), cfg.n_blocks, seed=0, modules=cfg.linear_modules())
    model = HybridLM(cfg, layer_factory=factory)
    held = {name: (m.block_index, m.name) for name, m in model.named_modules() if isinstance(m, PrecisionLinear)}
    assert held == cfg.linear_modules() and len(held) == 24


def test_the_factory_builds_each_linear_in_its_modules_precision_and_the_controller_says_which():
    cfg = ModelConfig.from_dict(MODEL)
    p = policy({"*.in_proj": "bf16", "blocks.3.*": "fp8_blockwise"})
    model = HybridLM(cfg, layer_factory=build_linear_factory(p, cfg.n_blocks, seed=0, modules=cfg.linear_modules()))
    layers = {name: m for name, m in model.named_modules() if isinstance(m, PrecisionLinear)}
    for i in (0, 2, 4, 8, 10):
        layer = layers[f"blocks.{i}.mixer.in_proj"]
        assert (
            not layer.quantized
            and layer.recipe.all_bf16
            and layer.precision_source == "precision.modules.*.in_proj: bf16"
        )
    assert layers["blocks.3.mixer.fc1"].recipe.fprop_x.format == "fp8_e4m3"
    assert layers["blocks.3.mixer.fc1"].recipe.fprop_w.tile == (128, 128)
    assert layers["blocks.0.mixer.out_proj"].recipe.fprop_x.format == "nvfp4"
    assert layers["blocks.0.mixer.out_proj"].precision_source == ""
    assert not layers["blocks.11.mixer.fc2"].quantized  # nvfp4's own BF16 last blocks still hold where no pattern is
    ctl = PrecisionController(p, model)
    assert ctl.module_lines == [
        "*.in_proj -> bf16: 5 linears (blocks.{0,2,4,8,10}.mixer.in_proj)",
        "blocks.3.* -> fp8_blockwise: 2 linears (blocks.3.mixer.fc1, blocks.3.mixer.fc2)",
    ]
    with pytest.raises(ValueError, match="precision.modules needs the model's linears"):
        build_linear_factory(p, cfg.n_blocks, seed=0)


def test_compact_names_gathers_block_indices():
    names = ["blocks.0.mixer.in_proj", "blocks.2.mixer.in_proj", "blocks.3.mixer.fc1", "lm_head"]
    assert compact_names(names) == "blocks.{0,2}.mixer.in_proj, blocks.3.mixer.fc1, lm_head"
    assert compact_names([]) == "none"


def test_one_backend_must_run_the_run_policy_and_every_quantized_module_preset():
    backend, reason = resolve_backend(policy({"*.fc1": "nvfp4"}, base="bf16"))
    assert backend.name == "emulated" and "format bf16" not in reason  # not "every linear is F.linear"
    assert resolve_backend(policy({"*.fc1": "bf16"}, base="bf16"))[1].startswith("format bf16")
    with pytest.raises(ConfigError, match=r"precision.backend='scaled_mm' cannot run here: .*precision.modules.\*.fc1"):
        resolve_backend(policy({"*.fc1": "nvfp4"}, base="bf16", backend="scaled_mm"))


# ------------------------------------------------------------------------------------------- refusals
M = "+precision.modules="
BAD_RULES = [
    (M + "{*.in_proj: bf17}", r"^precision.modules.\*.in_proj='bf17': no such precision preset; allowed: bf16, "),
    (M + "{blocks.99.*: bf16}", r"^precision.modules.blocks.99.\*: the pattern matches no linear of the model; "),
    (M + "{*.in_proj: 3}", r"^precision.modules.\*.in_proj=3: allowed: a precision preset \(bf16, .*\) or a mapping"),
    (M + "{*.in_proj: {backend: emulated}}", r"^precision.modules.\*.in_proj=.* sets backend='emulated': one backend "),
    (
        M + "{*.in_proj: {format: nvfp4, switch: {at_fraction: 0.5}}}",
        r"has a switch to BF16 at 0.5: the switch is one ",
    ),
    (M + "{*.in_proj: {modules: {x: {}}}}", r"^precision.modules.\*.in_proj: the preset has precision.modules of its"),
    (M + "{*.in_proj: {formt: bf16}}", r"^precision.modules.\*.in_proj: unknown key 'formt'"),
    ("precision.modules={*.in_proj: bf16}", r"^precision.modules: patterns are added with a leading \+, e.g. "),
]


@pytest.mark.parametrize("override, message", BAD_RULES)
def test_a_bad_module_rule_is_one_line_naming_the_key_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError, match=message) as e:
        load("train", ["model=hybrid_0p5m", "precision=nvfp4", override])
    assert "\n" not in str(e.value)


def test_a_matching_pattern_is_checked_against_the_runs_own_model():
    cfg = {"model": load_section("model", "transformer_1p2b"), "data": load_section("data", "bundled")}
    with pytest.raises(ConfigError, match="precision.modules.\\*.in_proj: the pattern matches no linear"):
        RunConfig(**cfg, precision=policy({"*.in_proj": "bf16"}).to_dict())  # a Transformer has no in_proj


def test_an_old_record_without_modules_resumes_without_a_note(tmp_path):
    new = load("train", ["precision=nvfp4"]).to_dict()
    old = {**new, "precision": {k: v for k, v in new["precision"].items() if k != "modules"}}
    assert resume_check(old, new, tmp_path) == []
    changed = load("train", ["precision=nvfp4", "+precision.modules={*.in_proj: bf16}"]).to_dict()
    assert resume_check(new, changed, tmp_path) == [
        "resume changes precision.modules: {} -> {'*.in_proj': 'bf16'} (a precision switch on resume; the weights "
        "and optimizer state carry over)"
    ]


# ------------------------------------------------------------------------------- a short CPU training run
def test_a_short_run_trains_the_chosen_linears_in_their_precision_and_records_it(tmp_path):
    """hybrid_0p5m in NVFP4 with every in_proj in BF16 and block 3 in FP8: the in_proj layers give no quantization
    telemetry (they quantize nothing), block 3's give FP8's, and the plan and config.yaml say which ran what."""
    out = tmp_path / "run"
    overrides = [
        f"out_dir={out}",
        "model=hybrid_0p5m",
        "precision=nvfp4",
        "+precision.modules={*.in_proj: bf16, blocks.3.*: fp8_blockwise}",
        "precision.stats_every=1",
        "train.max_steps=2",
        "train.seq_len=32",
        "train.global_batch_size=2",
        "train.eval_sequences=0",
        "train.log_every=1",
        "train.progress=false",
    ]
    run(RunConfig.from_omegaconf(compose("train", overrides)))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    quant = {key for r in records for key in r if key.startswith("quant/")}
    layers = {key.split("/")[1] for key in quant}
    assert not any(layer.endswith(".in_proj") for layer in layers)  # BF16: nothing quantized, nothing measured
    assert {"block0.out_proj", "block3.fc1", "block3.fc2", "block6.qkv"} <= layers
    assert "block10.out_proj" not in layers and "block11.fc2" not in layers  # nvfp4's BF16 last blocks
    # FP8 E4M3 (3 mantissa bits) quantizes the same kind of weight with far less error than NVFP4's E2M1 (1 bit)
    first = next(r for r in records if "quant/block3.fc1/fprop_w/rel_err" in r)
    assert first["quant/block3.fc1/fprop_w/rel_err"] < 0.5 * first["quant/block1.fc1/fprop_w/rel_err"]
    # the config the run recorded, read back as eval and export read it
    saved = yaml.safe_load((out / "config.yaml").read_text())
    recorded = PrecisionPolicy.from_dict(saved["precision"])
    assert recorded.for_module("blocks.3.mixer.fc1").format == "fp8_blockwise"
    assert recorded.for_module("blocks.4.mixer.in_proj").format == "bf16"
    assert saved["precision"]["modules"]["*.in_proj"]["name"] == "bf16"  # the preset's keys, not only its name
    expected = (
        "*.in_proj -> bf16: 5 linears (blocks.{0,2,4,8,10}.mixer.in_proj); "
        "blocks.3.* -> fp8_blockwise: 2 linears (blocks.3.mixer.fc1, blocks.3.mixer.fc2)"
    )
    assert saved["resolved"]["precision_modules"]["value"] == expected
    assert records[0]["resolved/precision_modules"] == expected
    log = (out / "train.log").read_text()
    assert "precision.modules: *.in_proj -> bf16: 5 linears" in log and "precision_modules" in log
    # eval's training precision (eval_precision=train) rebuilds each linear as the run trained it
    model, run_config, ckpt = load_run_model(out)
    rebuilt, _ = in_training_precision(model, run_config, ckpt, torch.device("cpu"))
    layers = dict(rebuilt.named_modules())
    assert not layers["blocks.0.mixer.in_proj"].quantized and layers["blocks.0.mixer.out_proj"].quantized
    assert layers["blocks.3.mixer.fc1"].recipe.fprop_x.format == "fp8_e4m3"
    assert torch.isfinite(torch.tensor([r["loss"] for r in records if "loss" in r])).all()
