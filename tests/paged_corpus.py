"""Decode (paged cache) snippets for the graph-pass tests, written like serving engines' eager
fallbacks and a V4-style Indexer decode branch (not copied from any of them).

``paged_indexer_decode`` (+ ``dequant_mxfp4_pages``) is the reference eager spelling, and
``PagedIndexer`` the official-style module: both are meant for reuse (GPU benchmarks compile
them with ``inductor_dsa.backend`` and with the default backend). The cache layout is the one
of docs/semantics.md, "Paged key cache": uint8 pages of 64 rows, a page = 64 rows of data, then 64 rows
of scales (MXFP4: D/2 packed E2M1 bytes + D/32 E8M0 bytes; FP8: D e4m3 bytes + a 4-byte fp32).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from inductor_dsa import formats
from pass_corpus import Case

PAGE = 64
E2M1_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


# ---- reusable reference spelling -----------------------------------------------------------------
def gather_pages(kv_cache, block_table):
    """[B, P * 64, row bytes] split into (data bytes, scale bytes) per key row."""
    bsz, n_pages = block_table.shape
    pages = kv_cache.reshape(kv_cache.shape[0], -1)[block_table]       # [B, P, 64 * row]
    return pages, bsz, n_pages


def dequant_mxfp4_pages(kv_cache, block_table, head_dim, lut=E2M1_LUT, bias=127):
    """Keys fp32 [B, P * 64, D] of every request: E2M1 codes by a 16-entry table (low nibble
    first), times 2^(E8M0 - 127) repeated over blocks of 32."""
    pages, bsz, n_pages = gather_pages(kv_cache, block_table)
    a, s = head_dim // 2, head_dim // 32
    codes = pages[..., : PAGE * a].reshape(bsz, n_pages * PAGE, a)
    scales = pages[..., PAGE * a:].reshape(bsz, n_pages * PAGE, s)
    table = torch.tensor(lut, dtype=torch.float32, device=kv_cache.device)
    vals = torch.stack([table[(codes & 0xF).long()], table[(codes >> 4).long()]], dim=-1).flatten(-2)
    return vals * torch.exp2(scales.float() - bias).repeat_interleave(32, dim=-1)


def paged_indexer_decode(q, kv_cache, weights, block_table, context_lens, topk=8):
    """Eager decode indexer over a paged MXFP4 cache: q [B, N, H, D], weights [B, N, H];
    returns (values, indices) [B, N, topk] over request-local rows j < context_lens[b]."""
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    return _score_topk(q, k, weights, context_lens, topk)


def _score_topk(q, k, weights, context_lens, topk):
    scores = torch.einsum("bnhd,bld->bnhl", q.float(), k)
    logits = (scores.relu() * weights.float().unsqueeze(-1)).sum(2)
    pos = torch.arange(k.shape[1], device=q.device)
    logits = logits.masked_fill(pos >= context_lens.view(-1, 1, 1), float("-inf"))
    return logits.topk(topk, dim=-1)


class PagedIndexer(nn.Module):
    """The decode branch of a V4-style Indexer over a paged MXFP4 key cache: projections, bf16
    q, weights * softmax_scale * H^-0.5, relu_ then the weighted head sum, the context mask,
    top-k, and -1 for slots past the context (as the official prefill marks them)."""

    def __init__(self, dim=48, heads=4, head_dim=64, topk=8):
        super().__init__()
        self.n_heads, self.head_dim, self.index_topk = heads, head_dim, topk
        self.softmax_scale = head_dim ** -0.5
        self.wq_b = nn.Linear(dim, heads * head_dim, bias=False)
        self.weights_proj = nn.Linear(dim, heads, bias=False)

    def forward(self, x, qr, kv_cache, block_table, context_lens):
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))
        weights = self.weights_proj(x) * (self.softmax_scale * self.n_heads ** -0.5)
        k = dequant_mxfp4_pages(kv_cache, block_table, self.head_dim).to(q.dtype)
        score = torch.einsum("bshd,btd->bsht", q, k)
        score = (score.relu_() * weights.unsqueeze(-1)).sum(dim=2)
        end = context_lens.view(-1, 1, 1)
        hidden = torch.arange(k.shape[1], device=x.device) >= end
        score = score.masked_fill(hidden, float("-inf"))
        idx = score.topk(min(self.index_topk, k.shape[1]), dim=-1)[1]
        return torch.where(idx >= end, -1, idx)


def make_paged_cache(gen, fmt, bsz, n_pages, head_dim, flavor="fn"):
    """(kv_cache uint8 [bsz * n_pages + 2, 64 * row], block_table int32 [bsz, n_pages]) of real
    encodings of random keys, pages shuffled."""
    total = bsz * n_pages + 2
    x = torch.randn(total * PAGE, head_dim, generator=gen) * torch.exp2(torch.randint(-3, 4, (total * PAGE, 1), generator=gen).float())
    cache = formats.pack_pages(*formats.encode_rows(x, fmt, flavor))
    table = torch.randperm(total, generator=gen)[: bsz * n_pages].view(bsz, n_pages).to(torch.int32)
    return cache, table


def make_decode_inputs(fmt="mxfp4", bsz=3, n=1, heads=4, head_dim=64, n_pages=3, lens=(5, 192, 100),
                       q_dtype=torch.bfloat16):
    def make(dtype, seed):
        g = torch.Generator().manual_seed(seed)
        cache, table = make_paged_cache(g, fmt, bsz, n_pages, head_dim)
        q = torch.randn(bsz, n, heads, head_dim, generator=g, dtype=torch.float64).to(q_dtype)
        w = torch.randn(bsz, n, heads, generator=g)
        return q, cache, w, table, torch.tensor(lens[:bsz], dtype=torch.int32)
    return make


def make_module(bsz=3, n=1, dim=48, n_pages=3, lens=(5, 192, 100), dtype=torch.bfloat16):
    def make(_, seed):
        torch.manual_seed(seed)
        m = PagedIndexer(dim=dim).to(dtype)
        g = torch.Generator().manual_seed(seed + 1)
        cache, table = make_paged_cache(g, "mxfp4", bsz, n_pages, m.head_dim)
        x = torch.randn(bsz, n, dim, generator=g).to(dtype)
        qr = torch.randn(bsz, n, dim, generator=g).to(dtype)
        return m, (x, qr, cache, table, torch.tensor(lens[:bsz], dtype=torch.int32))
    return make


def module_call(m, args):
    return m(*args)


# ---- other spellings ---------------------------------------------------------------------------
def _e2m1_arith(codes):
    """E2M1 by its bits: sign bit 3, exponent bits 1-2, mantissa bit 0 (subnormal at e = 0)."""
    sign = 1.0 - 2.0 * (codes >> 3).float()
    e, m = ((codes >> 1) & 3).float(), (codes & 1).float()
    return sign * torch.where(e == 0, 0.5 * m, torch.pow(2.0, e - 1) * (1.0 + 0.5 * m))


def decode_arith_logits(q, kv_cache, weights, block_table, context_lens):
    """Bit-arithmetic E2M1, pow(2, s - 127) broadcast by view/expand, keys cast to q's dtype,
    matmul, logits only, where(-inf)."""
    pages, bsz, n_pages = gather_pages(kv_cache, block_table)
    d = q.shape[-1]
    rows = n_pages * PAGE
    codes = pages[..., : PAGE * d // 2].reshape(bsz, rows, d // 2)
    sc = pages[..., PAGE * d // 2:].reshape(bsz, rows, d // 32, 1)
    vals = _e2m1_arith(torch.stack([codes & 15, codes >> 4], dim=-1).view(bsz, rows, d))
    k = (vals.view(bsz, rows, d // 32, 32) * torch.pow(2.0, sc.float() - 127).expand(-1, -1, -1, 32)).view(bsz, rows, d)
    s = torch.matmul(q, k.to(q.dtype).unsqueeze(1).transpose(-1, -2)).clamp(min=0)  # [B, N, H, L]
    logits = (s * weights.unsqueeze(-1)).sum(2)
    visible = torch.arange(rows)[None, None, :] < context_lens[:, None, None]
    return torch.where(visible, logits, float("-inf"))


def decode_ldexp_index_select(q, kv_cache, weights, block_table, context_lens, topk=8):
    """DeepGEMM-shaped cache [pages, 64, 1, row]; index_select over the flattened block table;
    ldexp with integer exponents; indices only, -1 past the context."""
    bsz, n_pages = block_table.shape
    d = q.shape[-1]
    flat = kv_cache.view(kv_cache.shape[0], -1).index_select(0, block_table.flatten().long())
    pages = flat.view(bsz, n_pages, -1)
    codes = pages[:, :, : PAGE * d // 2].reshape(bsz, -1, d // 2)
    sc = pages[:, :, PAGE * d // 2:].reshape(bsz, -1, d // 32)
    lut = torch.tensor(E2M1_LUT, device=q.device)
    vals = torch.stack((lut[codes.long() & 0xF], lut[codes.long() >> 4]), -1).reshape(bsz, -1, d)
    k = torch.ldexp(vals, (sc.to(torch.int32) - 127).repeat_interleave(32, dim=-1))
    vals, idx = _score_topk(q, k, weights, context_lens, topk)
    return torch.where(idx >= context_lens.view(-1, 1, 1), -1, idx)


def dequant_fp8_pages(kv_cache, block_table, head_dim, dtype=torch.float8_e4m3fn):
    """Keys fp32 [B, P * 64, D]: e4m3 bytes times the row's fp32 scale (4 bytes, .view(float32))."""
    pages, bsz, n_pages = gather_pages(kv_cache, block_table)
    vals = pages[..., : PAGE * head_dim].reshape(bsz, n_pages * PAGE, head_dim).view(dtype)
    scale = pages[..., PAGE * head_dim:].reshape(bsz, n_pages * PAGE, 4).view(torch.float32)
    return vals.float() * scale


def decode_fp8(q, kv_cache, weights, block_table, context_lens, topk=8):
    return _score_topk(q, dequant_fp8_pages(kv_cache, block_table, q.shape[-1]), weights, context_lens, topk)


def _int64_inputs(lens=(5, 2 ** 32 + 7, 100), negative_page=False):
    """int64 block table and context lengths (one length past 2^31: every row visible in eager);
    ``negative_page``: request 0's first page id written as id - num_pages (eager wraps it)."""
    def make(dtype, seed):
        q, c, w, t, _ = make_decode_inputs()(dtype, seed)
        t = t.long()
        if negative_page:
            t[0, 0] -= c.shape[0]
        return q, c, w, t, torch.tensor(lens, dtype=torch.int64)
    return make


def decode_lens_int32(q, kv_cache, weights, block_table, context_lens, topk=8):
    """int64 lengths narrowed by the user (``.int()`` wraps past 2^31): the mask is j < that."""
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    return _score_topk(q, k, weights, context_lens.int(), topk)


PAGED_CASES = [
    Case("paged_mxfp4_lut_reference", paged_indexer_decode, make_decode_inputs(), {"paged_indexer_topk": 1},
         outputs="both"),
    Case("paged_mxfp4_lut_mtp2", paged_indexer_decode, make_decode_inputs(n=2, lens=(64, 130, 7)),
         {"paged_indexer_topk": 1}, outputs="both", notes="N=2 query tokens share j < context_lens[b]"),
    Case("paged_official_module_bf16", module_call, make_module(), {"paged_indexer_topk": 1}, post=True,
         dtypes=(torch.bfloat16,)),
    Case("paged_mxfp4_arith_logits", decode_arith_logits, make_decode_inputs(), {"paged_indexer_logits": 1},
         kind="logits"),
    Case("paged_mxfp4_ldexp_index_select", decode_ldexp_index_select,
         lambda dt, s: (lambda q, c, w, t, l: (q, c.view(c.shape[0], PAGE, 1, -1), w, t.long(), l))(
             *make_decode_inputs()(dt, s)), {"paged_indexer_topk": 1}, post=True),
    Case("paged_fp8_rows", decode_fp8, make_decode_inputs("fp8"), {"paged_indexer_topk": 1}, outputs="both"),
    Case("paged_mxfp4_fp32_q", paged_indexer_decode, make_decode_inputs(q_dtype=torch.float32),
         {"paged_indexer_topk": 1}, outputs="both", notes="fp32 q: three bf16 parts in the kernel"),
    Case("paged_fp8_fp16_q_mtp2", decode_fp8, make_decode_inputs("fp8", n=2, q_dtype=torch.float16),
         {"paged_indexer_topk": 1}, outputs="both", notes="fp16 q (q.float() peeled to fp16): two bf16 parts"),
    Case("paged_mxfp4_arith_fp32_q_logits", decode_arith_logits, make_decode_inputs(q_dtype=torch.float32),
         {"paged_indexer_logits": 1}, kind="logits", notes="k.to(q.dtype) is fp32: exact"),
    Case("paged_official_module_fp32", module_call, make_module(dtype=torch.float32), {"paged_indexer_topk": 1},
         post=True),
    Case("paged_int64_table_lens", paged_indexer_decode, _int64_inputs(), {"paged_indexer_topk": 1},
         outputs="both", notes="cast to int32 in the replacement, lengths clamped first"),
    Case("paged_int64_negative_page", paged_indexer_decode, _int64_inputs((150, 7, 100), negative_page=True),
         {"paged_indexer_topk": 1}, outputs="both", notes="a page id < 0 inside the context"),
    Case("paged_int64_lens_narrowed", decode_lens_int32, _int64_inputs((2 ** 32 + 70, 192, 2 ** 32 + 100)),
         {"paged_indexer_topk": 1}, outputs="both", extra={"lens": torch.Tensor.int},
         notes="the user's .int() wraps 2^32 + 70 to 70"),
]


# ---- near-misses: decode chains that differ in one way; each must stay as it is ----------------
def _lut_variant(lut=E2M1_LUT, bias=127):
    def fn(q, kv_cache, weights, block_table, context_lens):
        k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1], lut, bias)
        return _score_topk(q, k, weights, context_lens, 8)
    return fn


def nm_block_16(q, kv_cache, weights, block_table, context_lens):
    pages, bsz, n_pages = gather_pages(kv_cache, block_table)
    d, rows = q.shape[-1], n_pages * PAGE
    codes = pages[..., : PAGE * d // 2].reshape(bsz, rows, d // 2)
    sc = pages[..., PAGE * d // 2:].reshape(bsz, rows, d // 32)
    lut = torch.tensor(E2M1_LUT)
    vals = torch.stack([lut[(codes & 0xF).long()], lut[(codes >> 4).long()]], -1).view(bsz, rows, d // 32, 32)
    s = torch.exp2(sc.float() - 127).repeat_interleave(16, dim=-1).unsqueeze(2)   # block = 16 elements
    return _score_topk(q, (vals * s).view(bsz, rows, d), weights, context_lens, 8)


def nm_high_nibble_first(q, kv_cache, weights, block_table, context_lens):
    pages, bsz, n_pages = gather_pages(kv_cache, block_table)
    d, rows = q.shape[-1], n_pages * PAGE
    codes = pages[..., : PAGE * d // 2].reshape(bsz, rows, d // 2)
    sc = pages[..., PAGE * d // 2:].reshape(bsz, rows, d // 32)
    lut = torch.tensor(E2M1_LUT)
    vals = torch.stack([lut[(codes >> 4).long()], lut[(codes & 0xF).long()]], -1).flatten(-2)
    return _score_topk(q, vals * torch.exp2(sc.float() - 127).repeat_interleave(32, -1), weights, context_lens, 8)


def nm_row_interleaved(q, kv_cache, weights, block_table, context_lens):
    """Reads each 68-byte row as [data | scales]: a different cache layout than the pages'."""
    pages, bsz, n_pages = gather_pages(kv_cache, block_table)
    d = q.shape[-1]
    rows = pages.reshape(bsz, n_pages * PAGE, d // 2 + d // 32)
    codes, sc = rows[..., : d // 2], rows[..., d // 2:]
    lut = torch.tensor(E2M1_LUT)
    vals = torch.stack([lut[(codes & 0xF).long()], lut[(codes >> 4).long()]], -1).flatten(-2)
    return _score_topk(q, vals * torch.exp2(sc.float() - 127).repeat_interleave(32, -1), weights, context_lens, 8)


def nm_mask_le(q, kv_cache, weights, block_table, context_lens):
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    logits = (torch.einsum("bnhd,bld->bnhl", q.float(), k).relu() * weights.unsqueeze(-1)).sum(2)
    pos = torch.arange(k.shape[1])
    return logits.masked_fill(pos > context_lens.view(-1, 1, 1), float("-inf")).topk(8)  # j <= ctx visible


def nm_weights_before_relu(q, kv_cache, weights, block_table, context_lens):
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    logits = (torch.einsum("bnhd,bld->bnhl", q.float(), k) * weights.unsqueeze(-1)).relu().sum(2)
    pos = torch.arange(k.shape[1])
    return logits.masked_fill(pos >= context_lens.view(-1, 1, 1), float("-inf")).topk(8)


def nm_smallest(q, kv_cache, weights, block_table, context_lens):
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    logits = (torch.einsum("bnhd,bld->bnhl", q.float(), k).relu() * weights.unsqueeze(-1)).sum(2)
    pos = torch.arange(k.shape[1])
    return logits.masked_fill(pos >= context_lens.view(-1, 1, 1), float("inf")).topk(8, largest=False)


def nm_mtp_causal(q, kv_cache, weights, block_table, context_lens):
    """MTP with a causal offset per query token: token n sees j < ctx[b] - (N - 1) + n."""
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    logits = (torch.einsum("bnhd,bld->bnhl", q.float(), k).relu() * weights.unsqueeze(-1)).sum(2)
    n = q.shape[1]
    end = context_lens.view(-1, 1, 1) - (n - 1) + torch.arange(n).view(1, -1, 1)
    return logits.masked_fill(torch.arange(k.shape[1]) >= end, float("-inf")).topk(8)


def nm_lens_plus_one(q, kv_cache, weights, block_table, context_lens):
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    return _score_topk(q, k, weights, context_lens + 1, 8)


def nm_lens_of_first(q, kv_cache, weights, block_table, context_lens):
    """Every request masked by request 0's length."""
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    return _score_topk(q, k, weights, context_lens[:1].expand(q.shape[0]), 8)


def nm_lens_halved(q, kv_cache, weights, block_table, context_lens):
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1])
    return _score_topk(q, k, weights, context_lens.int() // 2, 8)


def nm_fp64_scores(q, kv_cache, weights, block_table, context_lens):
    """q and keys in float64: the kernels take bf16 / fp16 / fp32 q."""
    k = dequant_mxfp4_pages(kv_cache, block_table, q.shape[-1]).double()
    scores = torch.einsum("bnhd,bld->bnhl", q, k)
    logits = (scores.relu() * weights.double().unsqueeze(-1)).sum(2)
    pos = torch.arange(k.shape[1])
    return logits.masked_fill(pos >= context_lens.view(-1, 1, 1), float("-inf")).topk(8)


class LutBuffer(nn.Module):
    """The table is a module buffer: an input of the graph, its values unknown when compiling.
    ``decode(lut, codes, sc)`` -> fp32 keys (default: both nibbles through the table, low first,
    times 2^(E8M0 - 127) over blocks of 32)."""

    def __init__(self, lut=E2M1_LUT, decode=None):
        super().__init__()
        self.register_buffer("lut", torch.tensor(lut))
        self.decode = decode or _lut_decode

    def forward(self, q, kv_cache, weights, block_table, context_lens):
        pages, bsz, n_pages = gather_pages(kv_cache, block_table)
        d, rows = q.shape[-1], n_pages * PAGE
        codes = pages[..., : PAGE * d // 2].reshape(bsz, rows, d // 2)
        sc = pages[..., PAGE * d // 2:].reshape(bsz, rows, d // 32)
        return _score_topk(q, self.decode(self.lut, codes, sc), weights, context_lens, 8)


def _scales(sc):
    return torch.exp2(sc.float() - 127).repeat_interleave(32, -1)


def _lut_decode(lut, codes, sc):
    return torch.stack([lut[(codes & 0xF).long()], lut[(codes >> 4).long()]], -1).flatten(-2) * _scales(sc)


def _lut_low_nibble_twice(lut, codes, sc):
    return torch.stack([lut[(codes & 0xF).long()], lut[(codes & 0xF).long()]], -1).flatten(-2) * _scales(sc)


def _lut_squared(lut, codes, sc):
    return torch.stack([lut[(codes & 0xF).long()], lut[(codes >> 4).long()]], -1).flatten(-2) ** 2 * _scales(sc)


def _lut_used_twice(lut, codes, sc):
    vals = torch.stack([lut[(codes & 0xF).long()], lut[(codes >> 4).long()]], -1).flatten(-2)
    return vals * vals.abs() * _scales(sc)


def _lut_cast_bf16(lut, codes, sc):
    return _lut_decode(lut, codes, sc).bfloat16().float()


# tables for the graph-input spellings: E2M1 permuted, E2M1 scaled by a non-power of two
_PERMUTED = tuple(E2M1_LUT[i] for i in (3, 9, 14, 0, 7, 12, 5, 1, 15, 10, 2, 8, 13, 6, 11, 4))
_SCALED = tuple(v * 0.37 for v in E2M1_LUT)
_LUT_MODULES = {name: LutBuffer(lut) for name, lut in (("e2m1", E2M1_LUT), ("permuted", _PERMUTED),
                                                        ("scaled", _SCALED))}


def _lut_module_call(name):
    def call(*a):
        return _LUT_MODULES[name](*a)
    return call


_WRONG_ENTRY = E2M1_LUT[:7] + (5.0,) + E2M1_LUT[8:]
_UNSIGNED = E2M1_LUT[:8] * 2

PAGED_NEAR_MISSES = [
    Case("paged_lut_entry_changed", _lut_variant(lut=_WRONG_ENTRY), make_decode_inputs(), {},
         reject="differs from MXFP4"),
    Case("paged_lut_no_sign", _lut_variant(lut=_UNSIGNED), make_decode_inputs(), {}, reject="differs from MXFP4"),
    Case("paged_scale_bias_128", _lut_variant(bias=128), make_decode_inputs(), {}, reject="differs from MXFP4"),
    Case("paged_scale_block_16", nm_block_16, make_decode_inputs(), {}, reject="neither this row's data nor"),
    Case("paged_high_nibble_first", nm_high_nibble_first, make_decode_inputs(), {}, reject="differs from MXFP4"),
    Case("paged_row_interleaved_layout", nm_row_interleaved, make_decode_inputs(), {},
         reject="neither this row's data nor"),
    Case("paged_mask_le", nm_mask_le, make_decode_inputs(), {}, reject="not context_lens[b]"),
    Case("paged_weights_before_relu", nm_weights_before_relu, make_decode_inputs(), {}, reject="before relu"),
    Case("paged_largest_false", nm_smallest, make_decode_inputs(), {}, reject="largest=False"),
    Case("paged_mtp_causal_offset", nm_mtp_causal, make_decode_inputs(n=2), {}, reject="not context_lens[b]"),
    Case("paged_int64_lens_plus_one", nm_lens_plus_one, _int64_inputs((5, 150, 100)), {},
         reject="not context_lens[b]"),
    Case("paged_int64_lens_of_first", nm_lens_of_first, _int64_inputs((5, 150, 100)), {},
         reject="not a 1-D context_lens indexed by the request"),
    Case("paged_int64_lens_halved", nm_lens_halved, _int64_inputs((5, 150, 2 ** 32 + 9)), {},
         reject="not context_lens[b]"),
    Case("paged_official_module_fp16", module_call, make_module(dtype=torch.float16), {},
         reject="rounds MXFP4 values", notes="k.to(q.dtype) in fp16: 6 * 2^(s - 127) overflows or flushes"),
    Case("paged_fp64_q", nm_fp64_scores, make_decode_inputs(q_dtype=torch.float64), {},
         reject="are not one of bf16/fp16/fp32"),
    Case("paged_lut_buffer_low_nibble_twice", lambda *a: _LUT_NEAR["low_twice"](*a), make_decode_inputs(), {},
         reject="indexed by something other than the nibble"),
    Case("paged_lut_buffer_squared", lambda *a: _LUT_NEAR["squared"](*a), make_decode_inputs(), {},
         reject="not read once as lut[nibble]"),
    Case("paged_lut_buffer_used_twice", lambda *a: _LUT_NEAR["twice"](*a), make_decode_inputs(), {},
         reject="not read once as lut[nibble]"),
    Case("paged_lut_buffer_cast_bf16", lambda *a: _LUT_NEAR["bf16"](*a), make_decode_inputs(), {},
         reject="cast to torch.bfloat16"),
]
_LUT_NEAR = {"low_twice": LutBuffer(decode=_lut_low_nibble_twice), "squared": LutBuffer(decode=_lut_squared),
             "twice": LutBuffer(decode=_lut_used_twice), "bf16": LutBuffer(decode=_lut_cast_bf16)}
# the decode table as a graph input (a module buffer): passed as the ops' table operand
PAGED_CASES += [
    Case("paged_lut_buffer_e2m1", _lut_module_call("e2m1"), make_decode_inputs(), {"paged_indexer_topk": 1},
         outputs="both", notes="the E2M1 table as a module buffer (a graph input): passed as the ops' table",
         extra={"table": E2M1_LUT}),
    Case("paged_lut_buffer_permuted", _lut_module_call("permuted"), make_decode_inputs(), {"paged_indexer_topk": 1},
         outputs="both", extra={"table": _PERMUTED}),
    Case("paged_lut_buffer_scaled", _lut_module_call("scaled"), make_decode_inputs(n=2, lens=(64, 130, 7)),
         {"paged_indexer_topk": 1}, outputs="both", notes="fp32 keys not exact in bf16: 3 bf16 key parts",
         extra={"table": _SCALED}),
]
