"""One torch thread for the distillation tests: their tensors are small, and on a shared 2-core machine
torch's intra-op threads waiting on each other made one test 50× slower (15 s instead of 0.3 s)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def single_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
