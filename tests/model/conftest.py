import pytest
import torch

from tests.conftest import SMALL_MODEL

SMALL = SMALL_MODEL


@pytest.fixture
def small_cfg_dict():
    return dict(SMALL)


@pytest.fixture
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")
