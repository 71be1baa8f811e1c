"""Sparse attention test helpers shared by several test modules: random inputs on the device
under test (``make``), the check of out / lse against the float64 oracle (``assert_close``), and
the special-sink / NaN-query check of any implementation (``check_special_sinks``)."""
from __future__ import annotations

import torch

from inductor_dsa import reference
from inductor_dsa.kernels import configs

# the Triton interpreter runs on the CPU; without it (and without a GPU) test_sparse_attention skips
DEVICE = "cpu" if configs.interpreting() or not torch.cuda.is_available() else "cuda"
NAN, INF = float("nan"), float("inf")

# |out - oracle| <= OUT_TOL * max|kv| + 2**-7 |oracle|   (bf16 output rounding is <= 2**-8 relative)
OUT_TOL = 1e-4 if DEVICE == "cpu" else 1e-2
LSE_TOL = 1e-4 if DEVICE == "cpu" else 2e-3


def make(b, m, h, d, n, topk, *, holes=0.2, seed=0, dtype=torch.bfloat16, sink=True):
    """(q, kv, indices, sink) on DEVICE, seeded: a ``holes`` share of -1 slots, repeated indices."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, m, h, d, generator=g).to(dtype)
    kv = torch.randn(b, n, d, generator=g).to(dtype)
    idx = torch.randint(0, max(n, 1), (b, m, topk), generator=g, dtype=torch.int32)
    idx[torch.rand(b, m, topk, generator=g) < holes] = -1
    s = (torch.rand(h, generator=g) * 4 + 1) if sink else None  # comparable to log(sum exp s_j)
    to = lambda x: None if x is None else x.to(DEVICE)
    return to(q), to(kv), to(idx), to(s)


def assert_close(q, kv, idx, sink, out, lse, scale=None):
    """out / lse of the op within OUT_TOL / LSE_TOL of the float64 oracle; returns the oracle's."""
    ref_out, ref_lse = reference.sparse_attention(q.cpu(), kv.cpu(), idx.cpu(),
                                                  None if sink is None else sink.cpu(), scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    out, lse = out.cpu().double(), lse.cpu().double()
    assert not out.isnan().any() and not lse.isnan().any()
    tol = OUT_TOL * kv.abs().max().item() + 2**-7 * ref_out.abs()
    err = (out - ref_out).abs()
    assert (err <= tol).all(), f"max out error {err.max().item():.3g} (worst excess {(err - tol).max().item():.3g})"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse -inf pattern differs"
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin], ref_lse[fin], rtol=0, atol=LSE_TOL)
    return ref_out, ref_lse


def check_special_sinks(q, kv, idx, run):
    """``run(q, kv, idx, sink) -> (out, lse)`` on CPU tensors (H = 4), against the oracle: sink per
    head +inf (out 0), NaN (out NaN), -inf (= no sink); lse never includes it; a NaN in q: that
    query's out and lse are NaN (lse is not the -inf of 'no slot')."""
    sink = torch.tensor([INF, NAN, -INF, 1.0])
    out, lse = run(q, kv, idx, sink)
    no_sink_out, no_sink_lse = run(q, kv, idx, None)
    ref_out, ref_lse = reference.sparse_attention(q, kv, idx, sink, None)
    assert (out[:, :, 0] == 0).all() and (ref_out[:, :, 0] == 0).all()
    assert out[:, :, 1].isnan().all() and ref_out[:, :, 1].isnan().all()
    torch.testing.assert_close(out[:, :, 2], no_sink_out[:, :, 2])
    torch.testing.assert_close(lse, no_sink_lse)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-4)
    q = q.clone()
    q[0, 0, 3, 0] = NAN
    out, lse = run(q, kv, idx, None)
    assert out[0, 0, 3].isnan().all() and lse[0, 0, 3].isnan()
    assert reference.sparse_attention(q, kv, idx, None, None)[1][0, 0, 3].isnan()
    assert not lse[0, 1].isnan().any()
