from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_thread():
    """The tensors here are tiny: one intra-op thread is faster, and far faster on a shared 2-core box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    """Tests marked gpu in this folder skip cleanly without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)
