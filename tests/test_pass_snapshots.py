"""Snapshots of the rewritten region, rendered by patterns.indexer.render.

The rendering names indices by role (r rows, b batch, h heads, d head_dim, j keys), renames
size symbols S0, S1, ... and never prints node names or generated code, so it reads the
same on torch 2.11-2.15. Regenerate with EXPECTTEST_ACCEPT=1.
"""
import expecttest
import torch

from attention_corpus import ATTENTION_CASES
from inductor_dsa import lowering
from pass_corpus import (deepgemm_ref_logits, make_official, make_ranges, matmul_triu, official_fn,
                         tokenspeed_style, _qkw)
from pass_helpers import compile_run


def region(fn, args, dynamic=None):
    compile_run(fn, args, dynamic=dynamic)
    (swap,) = lowering.report().swaps
    return swap.region


class TestRegions(expecttest.TestCase):
    def test_official_b1(self):
        self.assertExpectedInline(region(official_fn, make_official(1)(torch.float32, 0)), """\
indexer_topk  rows (r0=32) heads (h0=4) head_dim (d0=32) keys (j0=8)
  q       [1, r0, h0, d0] float32 -> [rows, heads, head_dim]
  k       [1, j0, d0] float32 -> [keys, head_dim]
  weights [1, r0, h0] -> [rows, heads]
  ranges  0 <= key < floor(r0/4 + 1/4)
  fill    -inf (added)
  out     [1, r0, k] float32
  top-k   k=6 -> indices; empty slots get masked columns""")

    def test_official_b2_dynamic(self):
        args = make_official(2)(torch.float32, 0)
        for x in args:
            torch._dynamo.mark_dynamic(x, 1)
        self.assertExpectedInline(region(official_fn, args), """\
indexer_topk  rows (b0=2, r0=S0) heads (h0=4) head_dim (d0=32) keys (j0=S1)
  q       [b0, r0, h0, d0] float32 -> [rows, heads, head_dim]
  k       [b0, j0, d0] float32 -> [batch*keys, head_dim], ranges offset by batch*keys
  weights [b0, r0, h0] -> [rows, heads]
  ranges  0 <= key < floor(r0/4 + 1/4)
  fill    -inf (added)
  out     [b0, r0, k] float32
  top-k   k=Min(6, (S0//4)) -> indices; empty slots get masked columns""")

    def test_deepgemm_ranges(self):
        self.assertExpectedInline(region(deepgemm_ref_logits, make_ranges(torch.float32, 0)), """\
indexer_logits  rows (r0=24) heads (h0=4) head_dim (d0=32) keys (j0=20)
  q       [r0, h0, d0] float32 -> [rows, heads, head_dim]
  k       [j0, d0] float32 -> [keys, head_dim]
  weights [r0, h0] -> [rows, heads]
  ranges  tensor0(r0) <= key < tensor1(r0)
  fill    -inf (selected)
  out     [r0, j0] float32""")

    def test_window_finfo(self):
        self.assertExpectedInline(region(tokenspeed_style, _qkw(torch.float32, 0)), """\
indexer_topk  rows (r0=24) heads (h0=4) head_dim (d0=32) keys (j0=20)
  q       [r0, h0, d0] float32 -> [rows, heads, head_dim]
  k       [j0, d0] float32 -> [keys, head_dim]
  weights [r0, h0] -> [rows, heads]
  ranges  r0 - 6 <= key < r0 + 1
  fill    -3.40282e+38 (selected)
  out     [r0, k] float32
  top-k   k=3 -> values and indices; empty slots get masked columns""")

    def test_triu_weighted_bmm(self):
        self.assertExpectedInline(region(matmul_triu, _qkw(torch.float32, 0)), """\
indexer_topk  rows (r0=24) heads (h0=4) head_dim (d0=32) keys (j0=20)
  q       [r0, h0, d0] float32 -> [rows, heads, head_dim]
  k       [j0, d0] float32 -> [keys, head_dim]
  weights [r0, h0] -> [rows, heads]
  ranges  0 <= key < r0 + 1
  fill    -inf (added)
  out     [r0, k] float32
  top-k   k=4 -> indices; empty slots get masked columns""")

    def test_attention_cat_sink_module(self):
        (case,) = [c for c in ATTENTION_CASES if c.name == "module_cat_sink"]
        self.assertExpectedInline(region(case.fn, case.make(torch.bfloat16, 0)), """\
sparse_attention  batch (b0=2) rows (r0=3) heads (h0=8) head_dim (d0=32) keys (j0=7) kv_rows (n0=13)
  q       [b0, r0, h0, d0] bfloat16 -> [batch, rows, heads, head_dim]
  kv      [b0, n0, d0] bfloat16 -> [batch, kv_rows, head_dim], K = V
  indices [b0, r0, j0] int64 -> [batch, rows, keys], -1 = empty
  sink    [h0] float32 -> [heads] float32
  scale   0.176777
  empty   zeros (the sink is in the shift, as in eager)
  out     [b0, r0, h0, d0] bfloat16 (op in bfloat16)""")

    def test_attention_bf16_sink_outside_the_shift(self):
        (case,) = [c for c in ATTENTION_CASES if c.name == "shift_without_sink"]
        self.assertExpectedInline(region(case.fn, case.make(torch.bfloat16, 0)), """\
sparse_attention  batch (b0=2) rows (r0=3) heads (h0=8) head_dim (d0=32) keys (j0=7) kv_rows (n0=13)
  q       [b0, r0, h0, d0] bfloat16 -> [batch, rows, heads, head_dim]
  kv      [b0, n0, d0] bfloat16 -> [batch, kv_rows, head_dim], K = V
  indices [b0, r0, j0] int64 -> [batch, rows, keys], -1 = empty
  sink    [h0, 1] bfloat16 -> [heads] float32
  scale   0.176777
  empty   NaN (eager divides 0 by 0; restored where the op's lse is -inf)
  out     [b0, r0, h0, d0] bfloat16 (op in bfloat16)""")


if __name__ == "__main__":
    import unittest
    unittest.main()
