"""Two GPUs: every op runs on its inputs' GPU, not the current one (Triton launches on the
current device; the ops switch to the inputs' for the call).

Run on a machine with two GPUs: python -m pytest -q tests/test_devices.py
"""
import pytest
import torch

from op_cases import cases

TWO = torch.cuda.is_available() and torch.cuda.device_count() >= 2
pytestmark = pytest.mark.skipif(not TWO, reason="needs two CUDA / ROCm GPUs")

CASES = cases("cuda:1") if TWO else []


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_runs_on_the_inputs_gpu(case):
    torch.cuda.set_device(0)
    x = case.make(0)
    out = case.call(x)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    case.check(x, out)
