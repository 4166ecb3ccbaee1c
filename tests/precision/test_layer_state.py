"""A QuantLinear's random constants are its buffers: the SR stream seeds (`sr_seeds`, one per operand role) and
the RHT sign vector (`rht_signs`) travel in its state_dict, and what is loaded is what the layer draws from. A
state dict written before they were stored (or under another RHT size) loads, each layer keeping the values its
seed and policy give it, and nothing else loses its strictness."""

import pytest
import torch

from nvfp4train.formats import hadamard, rounding
from nvfp4train.model.layers import LINEAR_NAMES
from nvfp4train.precision import QuantLinear
from nvfp4train.precision.recipe import ROLES

from .helpers import inputs, load_preset, make_layer, run

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _layer(policy, seed=0, rht_signs=None, device=None, block_index=0):
    layer = QuantLinear(
        64,
        48,
        policy=policy,
        block_index=block_index,
        n_blocks=4,
        name="fc2",
        seed=seed,
        rht_signs=rht_signs,
        device=device,
    )
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 64, generator=torch.Generator().manual_seed(0)) * 0.1)
    return layer


def test_seeds_and_signs_are_buffers_with_the_values_the_streams_always_had():
    layer = _layer(load_preset("nvfp4"), seed=5, block_index=2)
    state = layer.state_dict()
    assert set(state) == {"weight", "sr_seeds", "rht_signs"}
    base = (2 * 8 + LINEAR_NAMES.index("fc2")) * 8  # the stream ids every earlier run used
    assert state["sr_seeds"].tolist() == [rounding.stream_seed(5, base + i) for i in range(len(ROLES))]
    assert state["rht_signs"].tolist() == list(hadamard.WGRAD_SIGNS_16)
    mx = _layer(load_preset("mxfp4"))
    assert torch.equal(mx.rht_signs, hadamard.random_signs(32))
    bf16 = _layer(load_preset("bf16"))  # every layer has them: a precision switch on resume keeps the keys
    assert bf16.rht_signs.shape == (16,) and bf16.sr_seeds.shape == (len(ROLES),)


def test_loaded_seeds_are_the_streams_the_layer_draws_from():
    policy = load_preset("nvfp4_all_layers")  # SR on the gradient operands
    x, grad = inputs(out_f=48)
    a, b = _layer(policy, seed=0), _layer(policy, seed=1)
    dw_a, dw_b = run(a, x, grad)[2], run(b, x, grad)[2]
    assert not torch.equal(dw_a, dw_b)
    c = _layer(policy, seed=1)
    c.load_state_dict(_layer(policy, seed=0).state_dict())
    assert c.sr_seeds.tolist() == a.sr_seeds.tolist()
    assert torch.equal(run(c, x, grad)[2], dw_a)  # seed 0's draws, though built with seed 1


def test_loaded_signs_are_the_transform_the_layer_applies():
    policy = load_preset("nvfp4_all_layers", sr="none")  # RHT on the Wgrad operands, no randomness
    x, grad = inputs(out_f=48)
    ours, other = _layer(policy), _layer(policy, rht_signs=7)
    assert not torch.equal(ours.rht_signs, other.rht_signs)
    dw = run(ours, x, grad)[2]
    assert not torch.equal(run(other, x, grad)[2], dw)
    other.load_state_dict(ours.state_dict())
    assert torch.equal(other.rht_signs, ours.rht_signs) and torch.equal(run(other, x, grad)[2], dw)


def test_a_state_dict_without_them_loads_keeping_the_built_values_and_stays_strict_otherwise():
    policy = load_preset("nvfp4_all_layers")
    x, grad = inputs(out_f=48)
    reference = run(_layer(policy, seed=3), x, grad)
    old = {"weight": _layer(policy, seed=3).weight.detach().clone()}  # what a layer saved before the buffers
    layer = _layer(policy, seed=3)
    layer.load_state_dict(old)  # strict
    assert all(torch.equal(a, b) for a, b in zip(run(layer, x, grad), reference))
    # another RHT size (an mxfp4 run resumed as nvfp4): this layer keeps the signs of its own policy
    layer.load_state_dict(_layer(load_preset("mxfp4"), seed=3).state_dict())
    assert layer.rht_signs.tolist() == list(hadamard.WGRAD_SIGNS_16)
    with pytest.raises(RuntimeError, match="Missing key.*weight"):
        layer.load_state_dict({"sr_seeds": layer.sr_seeds.clone()})
    with pytest.raises(RuntimeError, match="Unexpected key.*bias"):
        layer.load_state_dict({**layer.state_dict(), "bias": torch.zeros(48)})


def test_controller_checkpoint_still_carries_each_streams_position():
    """The seeds are in the model's state dict; where each stream stands (per rank) is the controller's."""
    policy = load_preset("nvfp4_all_layers")
    x, grad = inputs(out_f=48)
    layer = make_layer(policy)
    run(layer, x, grad)
    positions = layer.generator_state()
    assert set(positions) == {"dgrad_dy", "wgrad_dy"}
    after = run(layer, x, grad)[2]
    again = make_layer(policy)
    again.load_state_dict(layer.state_dict())
    again.load_generator_state(positions)
    assert torch.equal(run(again, x, grad)[2], after)


@pytest.mark.gpu
@requires_cuda
def test_on_a_gpu_the_buffers_move_and_seed_the_cuda_streams():
    policy = load_preset("nvfp4_all_layers")
    cpu = _layer(policy, seed=9)
    gpu = _layer(policy, seed=1).cuda()
    gpu.load_state_dict(cpu.state_dict())  # a CPU checkpoint into a CUDA model
    assert gpu.sr_seeds.is_cuda and gpu.rht_signs.is_cuda
    generators = gpu.sr_generators(torch.device("cuda"))  # what a CUDA graph capture registers
    assert [g.device.type for g in generators] == ["cuda", "cuda"]
    assert [g.initial_seed() for g in generators] == [
        cpu.sr_seeds[ROLES.index(r)].item() for r in ("dgrad_dy", "wgrad_dy")
    ]
    built = _layer(policy, seed=9, device="cuda")
    x, grad = inputs(out_f=48)
    x, grad = x.cuda(), grad.cuda()

    def step(layer):
        layer.weight.grad = None
        xx = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(xx)
        y.backward(grad.to(y.dtype))
        return layer.weight.grad.clone()

    assert torch.equal(step(gpu), step(built))  # the loaded seeds, not the ones it was built with
