"""FSDP2's layout (a one-rank gloo group in this process): after forward, every block but the last has
given its gathered weights back (reshard_after_forward=True) or kept them (False); the loss and the
gradients are those of the unsharded model either way."""

import pytest
import torch
import torch.distributed
from torch.distributed.tensor import DTensor

from nvfp4train.model import HybridLM, ModelConfig
from nvfp4train.parallel import shard_fsdp2
from tests.conftest import SMALL_MODEL

SMALL = {**SMALL_MODEL, "name": "fsdp_small"}


@pytest.fixture
def one_rank_group(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("reshard", [True, False])
def test_reshard_after_forward_and_same_gradients(one_rank_group, reshard):
    torch.manual_seed(0)
    plain = HybridLM(ModelConfig.from_dict(SMALL))
    sharded = HybridLM(ModelConfig.from_dict(SMALL))
    sharded.load_state_dict(plain.state_dict())
    shard_fsdp2(sharded, reshard_after_forward=reshard)
    tokens = torch.randint(0, 97, (2, 17), generator=torch.Generator().manual_seed(1))
    loss = sharded(tokens[:, :-1], tokens[:, 1:])
    gathered = [not isinstance(block.norm.weight, DTensor) for block in sharded.blocks]
    assert gathered == [not reshard] * (len(gathered) - 1) + [True]  # the last block always keeps its weights
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # FSDP2 computes with BF16 copies of the weights
        ref = plain(tokens[:, :-1], tokens[:, 1:])
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(plain.named_parameters(), sharded.parameters()):
        torch.testing.assert_close(q.grad.full_tensor(), p.grad, rtol=0.1, atol=2e-3, msg=name)
