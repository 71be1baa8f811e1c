"""Test setup: kernels run on the GPU when there is one, else under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is imported, so it is set here, at collection.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def split(request, monkeypatch):
    """Force a sequence-split plan (``paged_cases.SPLITS[param]``, parametrize with indirect=True)
    on the paged indexer config of the device under test."""
    import dataclasses

    from inductor_dsa.kernels import configs
    from paged_cases import SPLITS

    target = configs.target_for(torch.device(DEVICE))
    cfg = configs.PAGED[target]
    monkeypatch.setitem(configs.PAGED, target, dataclasses.replace(cfg, **SPLITS[request.param]))
    return request.param


@pytest.fixture
def gen():
    """A fresh, seeded generator per test: random inputs, reproducible failures."""
    return torch.Generator().manual_seed(torch.initial_seed() % 2**31)


def misaligned_copy(x, offset=1, pad=0):
    """x [R, C] copied to byte ``offset`` of a buffer whose rows are ``pad`` elements longer: the
    same values at an address / row stride that need not be 4-byte aligned."""
    buf = torch.empty(x.numel() + x.shape[0] * pad + offset, dtype=x.dtype, device=x.device)
    return buf[offset:].view(x.shape[0], x.shape[1] + pad)[:, :x.shape[1]].copy_(x)
