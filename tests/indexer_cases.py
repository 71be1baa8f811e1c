"""Prefill indexer test helpers shared by several test modules: key ranges by kind, quantised
(q, k) pairs, tolerances, moving inputs to the device under test, and the checks of logits and
top-k against the float64 oracle (inductor_dsa.reference)."""
import torch

from inductor_dsa import formats, reference
from conftest import DEVICE


def mask_ranges(kind, t, n, gen):
    """(k_start, k_end) int32 [T] for a mask kind: full, causal, ratio4, or ragged (random starts /
    ends, some empty and some inverted rows, some past K)."""
    if kind == "full":
        return reference.full_ranges(t, n)
    if kind == "causal":
        return reference.causal_ranges(t, n)
    if kind == "ratio4":
        return reference.ratio_ranges(t, 4)
    # ragged: random starts/ends, some empty and some inverted rows, some past K
    a = torch.randint(-3, n + 3, (t,), generator=gen, dtype=torch.int32)
    b = torch.randint(-3, n + 3, (t,), generator=gen, dtype=torch.int32)
    return torch.minimum(a, b), torch.where(torch.arange(t) % 5 == 0, a - 1, torch.maximum(a, b))


def to_device_each(*xs):
    """Each argument (a tensor, or a tuple of tensors: a quantised pair) moved to DEVICE, as a list."""
    return [tuple(y.to(DEVICE) for y in x) if isinstance(x, tuple) else x.to(DEVICE) for x in xs]


def assert_logits(out, ref, tol):
    out = out.cpu().double()
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN pattern differs"  # logits keep NaN
    assert torch.equal(torch.isfinite(out), fin) and torch.equal(out[~fin].nan_to_num(0.0), ref[~fin].nan_to_num(0.0))
    scale = ref[fin].abs().max() if fin.any() else 1.0
    assert ((out - ref)[fin].abs().max() if fin.any() else 0) <= tol * scale


def logits_tol(kind):
    """Relative tolerance of the logits of a quantised kind (see ``quantised``)."""
    # Hopper's native fp8 wgmma accumulates with a reduced-precision adder (~2**-13 relative)
    return 2e-3 if kind.startswith("fp8 q") and DEVICE == "cuda" else 1e-5


def quantised(kind, q, k, gen):
    """(q, k) encoded as ``kind``: "mxfp4 k", "mxfp4 q+k", "fp8 k <flavor>", "fp8 q+k <flavor>"."""
    if kind == "mxfp4 k":
        return q, formats.mxfp4_encode(k)
    if kind == "mxfp4 q+k":
        return formats.mxfp4_encode(q), formats.mxfp4_encode(k)
    flavor = kind.split()[-1]
    kf8 = formats.fp8_encode_rows(k, flavor)
    if kind.startswith("fp8 q"):
        return q.float().clamp(-8, 8).to(formats.FP8_DTYPES[flavor]), kf8
    return q, kf8


def assert_topk(vals, idx, ref, topk, tol=1e-5):
    """Prefill top-k [T, topk] vs the fp64 logits [T, K]: set-with-tolerance selection, oracle values
    at the chosen columns, -1 / -inf padding, descending order."""
    vals, idx = vals.cpu(), idx.cpu()
    assert vals.dtype == torch.float32 and idx.dtype == torch.int32
    assert idx.shape == (ref.shape[0], topk) and vals.shape == idx.shape
    msg = reference.topk_mismatch(idx, ref, topk)
    assert msg is None, msg
    taken = idx >= 0
    assert (vals[~taken] == float("-inf")).all()
    want = ref.gather(1, idx.long().clamp(min=0)).nan_to_num(float("-inf"), float("inf"), float("-inf"))  # NaN reads -inf
    assert torch.equal(torch.isneginf(vals) & taken, torch.isneginf(want) & taken)
    taken &= torch.isfinite(want)
    got, want = torch.where(taken, vals.double(), 0), torch.where(taken, want, 0)
    fin = ref[torch.isfinite(ref)]
    scale = fin.abs().max().item() if fin.numel() else 1.0
    assert (got - want).abs().max() <= tol * max(scale, 1.0)
    v = vals.masked_fill(~taken, float("-inf"))
    assert (v[:, :-1] >= v[:, 1:]).all()  # descending
