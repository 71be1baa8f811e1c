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
def gen():
    """A fresh, seeded generator per test: random inputs, reproducible failures."""
    return torch.Generator().manual_seed(torch.initial_seed() % 2**31)
