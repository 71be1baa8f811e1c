"""Model-code snippets for the graph-pass tests, written in the styles the pass must read.

Styles: the official V4 Indexer prefill branch (4-D einsum, relu_, weights.unsqueeze(-1),
ratio mask added as where(mask, -inf, 0), topk(...)[1] then -1 post-processing), serving
engines' eager fallbacks (3-D q, matmul, masked_fill, finfo.min), DeepGEMM-style torch
references (einsum 'mhd,nd->hmn', ks/ke ranges, logits only). Written for these tests.

Each ``Case`` builds its inputs for a dtype and says what the pass must do with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    fn: Callable
    make: Callable            # (dtype, seed) -> args
    swaps: dict               # pattern -> expected count ({} for near-misses)
    kind: str = "topk"        # "topk" (output holds indices, maybe values) | "logits"
    outputs: str = "indices"  # for topk: "indices" | "values" | "both"
    post: bool = False        # indices already post-processed to -1 past the visible count
    dtypes: tuple = (torch.float32,)
    notes: str = ""
    reject: Optional[str] = None  # near-miss: a phrase the debug report must contain
    extra: dict = field(default_factory=dict)


T, H, D, K = 24, 4, 32, 20


def _qkw(dtype, seed, t=T, h=H, d=D, k=K):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, d, generator=g).to(dtype)
    kk = torch.randn(k, d, generator=g).to(dtype)
    w = torch.randn(t, h, generator=g).to(dtype)
    return q, kk, w


# ---- official-style module (4-D, batch, compressed keys, ratio mask) -------------------------
class ToyIndexer(nn.Module):
    """A small prefill indexer laid out like the V4 reference: projections, a compressed key
    cache, 4-D einsum, relu_ then per-head weights, ratio mask, top-k then -1 marking."""

    def __init__(self, dim=48, heads=H, head_dim=D, ratio=4, topk=6, max_len=64, batch=1):
        super().__init__()
        self.n_heads, self.head_dim, self.ratio, self.index_topk = heads, head_dim, ratio, topk
        self.softmax_scale = head_dim ** -0.5
        self.wq_b = nn.Linear(dim, heads * head_dim, bias=False)
        self.weights_proj = nn.Linear(dim, heads, bias=False)
        self.register_buffer("kv_cache", torch.zeros(batch, max_len // ratio, head_dim), persistent=False)

    def forward(self, x, qr, kv):
        bsz, seqlen, _ = x.shape
        ratio = self.ratio
        self.kv_cache[:bsz, : seqlen // ratio] = kv
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))
        weights = self.weights_proj(x) * (self.softmax_scale * self.n_heads ** -0.5)
        score = torch.einsum("bshd,btd->bsht", q, self.kv_cache[:bsz, : seqlen // ratio])
        score = (score.relu_() * weights.unsqueeze(-1)).sum(dim=2)
        hidden = torch.arange(seqlen // ratio, device=x.device).repeat(seqlen, 1) >= \
            torch.arange(1, seqlen + 1, device=x.device).unsqueeze(1) // ratio
        score += torch.where(hidden, float("-inf"), 0)
        idx = score.topk(min(self.index_topk, seqlen // ratio), dim=-1)[1]
        beyond = idx >= torch.arange(1, seqlen + 1, device=x.device).unsqueeze(1) // ratio
        return torch.where(beyond, -1, idx)


def make_toy(batch=1, seqlen=32, dim=48):
    def make(dtype, seed):
        torch.manual_seed(seed)
        m = ToyIndexer(dim=dim, batch=batch).to(dtype)
        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(batch, seqlen, dim, generator=g).to(dtype)
        qr = torch.randn(batch, seqlen, dim, generator=g).to(dtype)
        kv = torch.randn(batch, seqlen // m.ratio, D, generator=g).to(dtype)
        return m, (x, qr, kv)
    return make


def toy_call(m, args):
    return m(*args)


# ---- tensor-parallel indexer (heads split across ranks, partial scores all-reduced) -----------
class TPIndexer(nn.Module):
    """The V4 indexer prefill branch under tensor parallelism, laid out like the official one:
    the q projection and weights_proj are column-parallel (this rank holds ``n_heads // world``
    heads), the compressed key cache is replicated, each rank sums relu(q.k) * w over its own
    heads, ``dist.all_reduce`` sums the partial scores, then ratio mask, top-k, -1 marking.
    With world == 1 (all heads, no collective) it is the single-device oracle.

    Near-miss knobs: ``reduce_op`` (e.g. ReduceOp.MAX), ``after`` (applied to the reduced
    scores before the mask); ``functional`` uses the functional collective (no in-place write)."""

    def __init__(self, dim=40, q_dim=24, n_heads=8, head_dim=32, ratio=4, topk=5, max_len=64,
                 world=1, rank=0, reduce_op=None, after=None, functional=False):
        super().__init__()
        self.n_heads, self.head_dim, self.ratio, self.index_topk = n_heads, head_dim, ratio, topk
        self.world, self.rank = world, rank
        self.n_local_heads = n_heads // world
        self.softmax_scale = head_dim ** -0.5
        self.wq_b = nn.Linear(q_dim, self.n_local_heads * head_dim, bias=False)
        self.weights_proj = nn.Linear(dim, self.n_local_heads, bias=False)
        self.register_buffer("kv_cache", torch.zeros(1, max_len // ratio, head_dim), persistent=False)
        self.reduce_op, self.after, self.functional = reduce_op, after, functional

    def shard(self, world, rank, **knobs):
        """This rank's part of a full (world == 1) indexer: heads [rank * H/world, (rank+1) * H/world)."""
        dim, q_dim = self.weights_proj.in_features, self.wq_b.in_features
        m = TPIndexer(dim, q_dim, self.n_heads, self.head_dim, self.ratio, self.index_topk,
                      self.kv_cache.shape[1] * self.ratio, world, rank, **knobs)
        hl, d = self.n_heads // world, self.head_dim
        with torch.no_grad():
            m.wq_b.weight.copy_(self.wq_b.weight[rank * hl * d:(rank + 1) * hl * d])
            m.weights_proj.weight.copy_(self.weights_proj.weight[rank * hl:(rank + 1) * hl])
        return m.to(device=self.wq_b.weight.device, dtype=self.wq_b.weight.dtype)

    def forward(self, x, qr, kv):
        import torch.distributed as dist
        bsz, seqlen, _ = x.shape
        ratio = self.ratio
        self.kv_cache[:bsz, : seqlen // ratio] = kv
        q = self.wq_b(qr).unflatten(-1, (self.n_local_heads, self.head_dim))
        weights = self.weights_proj(x) * (self.softmax_scale * self.n_heads ** -0.5)
        index_score = torch.einsum("bshd,btd->bsht", q, self.kv_cache[:bsz, : seqlen // ratio])
        index_score = (index_score.relu_() * weights.unsqueeze(-1)).sum(dim=2)
        if self.world > 1:
            if self.functional:
                from torch.distributed import _functional_collectives as funcol
                index_score = funcol.all_reduce(index_score, "sum", dist.group.WORLD)
            else:
                dist.all_reduce(index_score, op=self.reduce_op or dist.ReduceOp.SUM)
        if self.after is not None:
            index_score = self.after(index_score)
        mask = torch.arange(seqlen // ratio, device=x.device).repeat(seqlen, 1) >= \
            torch.arange(1, seqlen + 1, device=x.device).unsqueeze(1) // ratio
        index_score += torch.where(mask, float("-inf"), 0)
        topk_idxs = index_score.topk(min(self.index_topk, seqlen // ratio), dim=-1)[1]
        beyond = topk_idxs >= torch.arange(1, seqlen + 1, device=x.device).unsqueeze(1) // ratio
        return torch.where(beyond, -1, topk_idxs)


def make_tp_inputs(m: TPIndexer, dtype, seed, seqlen=44):
    """(x, qr, kv) for a TPIndexer, the same on every rank for the same seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, seqlen, m.weights_proj.in_features, generator=g).to(dtype)
    qr = torch.randn(1, seqlen, m.wq_b.in_features, generator=g).to(dtype)
    kv = torch.randn(1, seqlen // m.ratio, m.head_dim, generator=g).to(dtype)
    return x, qr, kv


# ---- functional snippets ---------------------------------------------------------------------
def official_fn(q, kv, weights, ratio=4, index_topk=6):
    """The official branch as a function of already projected tensors (q [B,S,H,D])."""
    seqlen = q.size(1)
    index_score = torch.einsum("bshd,btd->bsht", q, kv)
    index_score = (index_score.relu_() * weights.unsqueeze(-1)).sum(dim=2)
    mask = torch.arange(seqlen // ratio).repeat(seqlen, 1) >= torch.arange(1, seqlen + 1).unsqueeze(1) // ratio
    index_score += torch.where(mask, float("-inf"), 0)
    topk_idxs = index_score.topk(min(index_topk, seqlen // ratio), dim=-1)[1]
    mask = topk_idxs >= torch.arange(1, seqlen + 1).unsqueeze(1) // ratio
    return torch.where(mask, -1, topk_idxs)


def make_official(batch, seqlen=32, ratio=4, shared_kv=False):
    def make(dtype, seed):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(batch, seqlen, H, D, generator=g).to(dtype)
        kv = torch.randn(1 if shared_kv else batch, seqlen // ratio, D, generator=g).to(dtype)
        if shared_kv:
            kv = kv.expand(batch, -1, -1)
        w = torch.randn(batch, seqlen, H, generator=g).to(dtype)
        return q, kv, w
    return make


def official_shared_kv(q, kv, weights, ratio=4, index_topk=6):
    """Batch > 1 with one key set for every sequence: 'bshd,td->bsht'."""
    seqlen = q.size(1)
    s = torch.einsum("bshd,td->bsht", q, kv)
    s = (F.relu(s) * weights[..., None]).sum(2)
    t = torch.arange(seqlen)[:, None]
    j = torch.arange(kv.size(0))[None, :]
    s = s.masked_fill(j >= (t + 1) // ratio, float("-inf"))
    return s.topk(min(index_topk, seqlen // ratio), dim=-1)


def fallback_causal(q, k, w):
    """Serving-engine fallback: a chunk of T queries at the end of K cached keys."""
    n_q, n_k = q.shape[0], k.shape[0]
    scores = torch.einsum("thd,kd->thk", q, k)
    logits = (scores.relu() * w[:, :, None]).sum(1)
    rows = torch.arange(n_q).unsqueeze(1)
    cols = torch.arange(n_k).unsqueeze(0)
    logits = logits.masked_fill(cols > rows + (n_k - n_q), float("-inf"))
    return torch.topk(logits, 5, dim=-1)


def deepgemm_ref_logits(q, kv, weights, ks, ke):
    """DeepGEMM-style torch reference: fp32, heads-first einsum, [ks, ke) per row, logits only."""
    n = kv.shape[0]
    cols = torch.arange(0, n)[None, :]
    visible = (cols >= ks[:, None]) & (cols < ke[:, None])
    score = torch.einsum("mhd,nd->hmn", q.float(), kv.float())
    logits = (score.relu() * weights.float().unsqueeze(-1).transpose(0, 1)).sum(dim=0)
    return logits.masked_fill(~visible, float("-inf"))


def make_ranges(dtype, seed):
    q, k, w = _qkw(dtype, seed)
    g = torch.Generator().manual_seed(seed + 7)
    ks = torch.randint(0, 6, (T,), generator=g)
    ke = ks + torch.randint(0, 15, (T,), generator=g)  # some rows empty, some past K
    return q, k, w, ks.int(), ke.int()


def matmul_triu(q, k, w):
    """matmul + clamp(min=0) + weighted bmm head sum + triu(-inf) additive causal, unsorted top-k."""
    s = q @ k.transpose(-1, -2)
    s = torch.clamp(s, min=0)
    s = torch.bmm(w.unsqueeze(1), s).squeeze(1)
    causal = torch.full((q.shape[0], k.shape[0]), float("-inf")).triu(1)
    return (s + causal).topk(4, dim=-1, sorted=False).indices


def bmm_heads_first(q, k, w):
    """Heads-first bmm with an explicit broadcast of k, F.relu, then an fp32 upcast."""
    h, d, n = q.shape[1], q.shape[2], k.shape[0]
    s = torch.bmm(q.transpose(0, 1), k.t().unsqueeze(0).expand(h, d, n))
    s = F.relu(s).float()
    return (s * w.t().float().unsqueeze(-1)).sum(0).topk(5)[0]


def tokenspeed_style(q, k, w, window=6):
    """fp32 oracle chain: sliding window [t - window, t] visible, finfo.min, sorted=False."""
    logits = torch.einsum("thd,kd->thk", q.float(), k.float()).clamp_min(0)
    logits = (logits * w.float().unsqueeze(-1)).sum(dim=1)
    t = torch.arange(q.shape[0]).view(-1, 1)
    j = torch.arange(k.shape[0]).view(1, -1)
    keep = (j <= t) & (j >= t - window)
    logits = torch.where(keep, logits, torch.finfo(torch.float32).min)
    vals, idx = logits.topk(3, dim=-1, sorted=False)
    return vals, idx


def weighted_einsum(q, k, w):
    """Head sum as an einsum with the weights, a scale after the sum, finfo.min causal."""
    s = torch.matmul(q.float(), k.float().t()).relu_()
    logits = torch.einsum("thk,th->tk", s, w.float()) * 0.5
    r = torch.arange(q.shape[0])[:, None]
    c = torch.arange(k.shape[0])[None, :]
    logits = torch.where(c <= r + (k.shape[0] - q.shape[0]), logits, torch.finfo(logits.dtype).min)
    return logits.topk(6, dim=-1)


def scaled_relu_logits(q, k, w):
    """Softmax scale applied to q.k before relu (a positive constant), logits only."""
    s = torch.relu(q @ k.T * q.shape[-1] ** -0.5)
    return (s * w[..., None]).sum(1)


def batched_logits(q, kv, weights):
    """4-D per-batch keys, logits only (no mask, no top-k)."""
    s = torch.einsum("bshd,btd->bsht", q, kv)
    return (s.relu() * weights.unsqueeze(-1)).sum(dim=2)


def single_query(q, k, w):
    """T = 1: one query row (a prefill of one token)."""
    s = torch.einsum("thd,kd->thk", q, k)
    return ((s.relu() * w.unsqueeze(-1)).sum(1)).topk(4)


def where_finfo_ratio(q, k, w, ratio=4):
    """Ratio mask spelled as where(mask, finfo.min, scores) on 3-D tensors."""
    n_q = q.shape[0]
    s = (torch.einsum("thd,kd->thk", q, k).relu() * w.unsqueeze(-1)).sum(1)
    hidden = torch.arange(k.shape[0]).unsqueeze(0) >= (torch.arange(n_q).unsqueeze(1) + 1) // ratio
    s = torch.where(hidden, torch.finfo(s.dtype).min, s)
    return s.topk(3, dim=-1)


def official_upcast(q, kv, weights, ratio=4, index_topk=6):
    """bf16 tensors upcast inside the 4-D einsum; where(mask, -inf, scores) spelling."""
    seqlen = q.size(1)
    score = torch.einsum("bshd,btd->bsht", q.float(), kv.float())
    score = (score.relu() * weights.float().unsqueeze(-1)).sum(dim=2)
    mask = torch.arange(seqlen // ratio).repeat(seqlen, 1) >= torch.arange(1, seqlen + 1).unsqueeze(1) // ratio
    score = torch.where(mask, float("-inf"), score)
    return score.topk(min(index_topk, seqlen // ratio), dim=-1)


def matmul_4d_broadcast(q, kv, weights):
    """matmul broadcasting k over the sequence dim, clamp(min=0), masked_fill with finfo.min."""
    s = torch.matmul(q, kv.unsqueeze(1).transpose(-1, -2))  # [B, S, H, D] @ [B, 1, D, T]
    s = (s.clamp(min=0) * weights[:, :, :, None]).sum(2)
    seqlen, n = q.shape[1], kv.shape[1]
    hidden = torch.arange(n)[None, :] > torch.arange(seqlen)[:, None] // 4
    return s.masked_fill(hidden, torch.finfo(s.dtype).min).topk(3, dim=-1).indices


def padded_rows(q, k, w, valid=17):
    """Causal, and rows past the valid length see nothing (a row-only condition)."""
    s = (_s3(q, k).relu() * w.unsqueeze(-1)).sum(1)
    t = torch.arange(q.shape[0]).unsqueeze(1)
    j = torch.arange(k.shape[0]).unsqueeze(0)
    return s.masked_fill(~((j <= t) & (t < valid)), float("-inf")).topk(4)


def tril_keep_bool(q, k, w):
    """HF-style: keep = ones(bool).tril(); masked_fill(~keep, -inf)."""
    s = (_s3(q, k).relu() * w.unsqueeze(-1)).sum(1)
    keep = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril()
    return s.masked_fill(~keep, float("-inf")).topk(4)


def tril_float_eq0(q, k, w):
    """A float 0/1 causal matrix compared with 0."""
    s = (_s3(q, k).relu() * w.unsqueeze(-1)).sum(1)
    keep = torch.tril(torch.ones(q.shape[0], k.shape[0]), diagonal=2)
    return s.masked_fill(keep == 0, float("-inf")).topk(4)


def tril_inverted(q, k, w):
    """Hides the lower triangle: the visible keys are t+1 <= j < K (a range starting late)."""
    s = (_s3(q, k).relu() * w.unsqueeze(-1)).sum(1)
    keep = torch.tril(torch.ones(q.shape[0], k.shape[0]))
    hide = torch.where(keep == 0, 0.0, 1.0)
    return s.masked_fill(hide == 1, float("-inf")).topk(2, dim=-1)


def decode_dense_gather(q, k_cache, weights, block_table, context_lens, topk=8):
    """Decode eager fallback: pages gathered by block_table into a dense [B, L, D] key,
    then the chain with `position < context_len[b]`. Read as a per-batch prefill: the
    gather stays in the user's graph."""
    bsz, _, _, d = q.shape
    k = k_cache[block_table].reshape(bsz, -1, d)
    scores = torch.einsum("bnhd,bld->bnhl", q.float(), k.float())
    logits = (scores.relu() * weights.float().unsqueeze(-1)).sum(2)
    pos = torch.arange(k.shape[1])
    logits = logits.masked_fill(pos[None, None, :] >= context_lens[:, None, None], float("-inf"))
    return logits.topk(topk, dim=-1)


def make_decode(dtype, seed, bsz=3, page=16, pages=4):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(bsz, 1, H, D, generator=g).to(dtype)
    cache = torch.randn(4 * bsz * pages, page, D, generator=g).to(dtype)
    w = torch.randn(bsz, 1, H, generator=g).to(dtype)
    table = torch.randperm(4 * bsz * pages, generator=g)[: bsz * pages].view(bsz, pages)
    lens = torch.tensor([5, page * pages, 33][:bsz])
    return q, cache, w, table, lens


def logits_finfo_selected(q, k, w):
    """Logits only, causal, masked entries set to finfo.min by where()."""
    s = (_s3(q, k).relu() * w.unsqueeze(-1)).sum(1)
    hide = torch.arange(k.shape[0])[None, :] > torch.arange(q.shape[0])[:, None]
    return torch.where(hide, torch.finfo(s.dtype).min, s)


def logits_finfo_added(q, k, w, window=5):
    """Logits only, a sliding window added as where(mask, finfo.min, 0)."""
    s = (_s3(q, k).relu() * w.unsqueeze(-1)).sum(1)
    t, j = torch.arange(q.shape[0])[:, None], torch.arange(k.shape[0])[None, :]
    outside = (j > t) | (j < t - window)
    return s + torch.where(outside, torch.finfo(s.dtype).min, 0.0)


def _s3(q, k):
    return torch.einsum("thd,kd->thk", q, k)


def v32_style_index_put(q, k, w):
    """transformers V3.2 / GLM spellings: relu(q @ k^T * scale), head sum as
    matmul(w.unsqueeze(-2), scores), in-place `logits[~tril] = -inf`, int32 indices."""
    s = torch.relu(torch.matmul(q.transpose(0, 1), k.t().unsqueeze(0)).transpose(0, 1) * D ** -0.5)
    logits = torch.matmul(w.unsqueeze(-2), s).squeeze(-2)
    tril = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril()
    logits[~tril] = float("-inf")
    return logits.topk(4, dim=-1).indices.to(torch.int32)


def transformers_mask_4d(q, k, w):
    """transformers' mask utilities build a [B, 1, S, T] causal mask from aranges (kv_idx <= q_idx,
    expanded); the V3.2 / GLM attention passes ``attention_mask[:, 0, :, :]`` (a select of the
    size-1 head dim) to the indexer, which masks its [B, S, T] scores with masked_fill(~mask)."""
    qi, kv = torch.arange(q.shape[0]), torch.arange(k.shape[0])
    mask = (kv[None, None, None, :] <= qi[None, None, :, None]).expand(1, -1, q.shape[0], k.shape[0])
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)[None]
    return s.masked_fill(~mask[:, 0, :, :], float("-inf")).topk(4, dim=-1).indices.to(torch.int32)


# ---- masks given as data (tensors the range proof cannot read: passed to the op's mask=) ----------
def _hidden(shape, seed, p=0.5):
    """A random bool tensor, True with probability ``p`` (rows with fewer visible keys than k occur)."""
    return torch.rand(shape, generator=torch.Generator().manual_seed(1000 + seed)) < p


def _with_data(*shapes, additive=False):
    """_qkw plus masks of ``shapes``: bool (True = hidden) or, additive, random finite biases with
    -inf where hidden."""
    def make(dt, s):
        q, k, w = _qkw(dt, s)
        out = []
        for i, shape in enumerate(shapes):
            m = _hidden(shape, s + i)
            if additive:
                bias = torch.randn(shape, generator=torch.Generator().manual_seed(s + 7))
                m = bias.masked_fill(m, float("-inf")).to(dt)
            out.append(m)
        return (q, k, w, *out)
    return make


def data_bool_tk(q, k, w, hidden):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    return s.masked_fill(hidden, float("-inf")).topk(4)


def data_bool_broadcast_1tk(q, k, w, hidden):
    s = torch.einsum("bthd,kd->bthk", q.unsqueeze(0), k).relu()
    s = torch.matmul(w[None].unsqueeze(-2), s).squeeze(-2)  # [1, T, K]
    keep = hidden.logical_not()  # True = visible, broadcast over nothing: [1, T, K]
    return s.masked_fill(~keep, torch.finfo(s.dtype).min).topk(4)


def data_bool_transposed(q, k, w, hidden_kt):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    return s.masked_fill(hidden_kt.t(), float("-inf")).topk(4)  # a [K, T] mask, transposed: a valid view


def data_additive_tk(q, k, w, bias):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    return (s + bias).topk(4)


def causal_and_data_padding(q, k, w, pad_hidden):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    keep = ~_causal(q.shape[0], k.shape[0]) & ~pad_hidden  # a provable range and a padding mask [K]
    return s.masked_fill(~keep, float("-inf")).topk(4)


def causal_and_int_padding(q, k, w, pad_hidden):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    s = s.masked_fill(_causal(q.shape[0], k.shape[0]), float("-inf"))  # a range
    attention_mask = (~pad_hidden).long()  # HF-style 0/1 int64 padding, indexed by the key: data
    return s.masked_fill(attention_mask[None, :] == 0, float("-inf")).topk(4)


def data_index_put(q, k, w, hidden):
    logits = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    logits[hidden] = float("-inf")
    return logits.topk(4)


def data_mask_per_batch_kv(q, kv, w, hidden):
    s = (torch.einsum("bthd,bkd->bthk", q, kv).relu() * w.unsqueeze(-1)).sum(2)  # [B, T, K], k per batch
    return s.masked_fill(hidden, float("-inf")).topk(4)


def _per_batch_data(dt, s, b=2):
    g = torch.Generator().manual_seed(s)
    q, kv, w = (torch.randn(b, T, H, D, generator=g).to(dt), torch.randn(b, K, D, generator=g).to(dt),
                torch.randn(b, T, H, generator=g).to(dt))
    return q, kv, w, _hidden((b, T, K), s)


def per_key_bias_logits(q, k, w):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    return s + k[:, 0]  # any finite tensor added after the head sum is an additive bias


CASES = [
    Case("toy_module_official_b1", toy_call, make_toy(1), {"indexer_topk": 1}, post=True,
         dtypes=(torch.float32, torch.bfloat16), notes="nn.Module, projections, kv cache buffer"),
    Case("official_fn_b1", official_fn, make_official(1), {"indexer_topk": 1}, post=True,
         dtypes=(torch.float32, torch.bfloat16)),
    Case("official_fn_b2_per_batch_kv", official_fn, make_official(2), {"indexer_topk": 1}, post=True,
         notes="per-batch k: rows and keys flattened, ranges offset by b*K"),
    Case("official_shared_kv_b2", official_shared_kv,
         lambda dt, s: (lambda q, kv, w: (q, kv[0], w))(*make_official(2)(dt, s)),
         {"indexer_topk": 1}, outputs="both"),
    Case("fallback_causal_thd", fallback_causal, lambda dt, s: _qkw(dt, s, t=12), {"indexer_topk": 1},
         outputs="both", dtypes=(torch.float32, torch.bfloat16)),
    Case("deepgemm_ref_logits", deepgemm_ref_logits, make_ranges, {"indexer_logits": 1}, kind="logits",
         dtypes=(torch.float32, torch.bfloat16)),
    Case("matmul_clamp_bmm_triu", matmul_triu, _qkw, {"indexer_topk": 1}),
    Case("bmm_heads_first_upcast", bmm_heads_first, _qkw, {"indexer_topk": 1}, outputs="values",
         dtypes=(torch.float32, torch.bfloat16)),
    Case("tokenspeed_window_finfo", tokenspeed_style, _qkw, {"indexer_topk": 1}, outputs="both"),
    Case("weighted_einsum_head_sum", weighted_einsum, _qkw, {"indexer_topk": 1}, outputs="both"),
    Case("scaled_relu_logits", scaled_relu_logits, _qkw, {"indexer_logits": 1}, kind="logits"),
    Case("batched_logits_per_batch_kv", batched_logits,
         lambda dt, s: make_official(2, seqlen=16)(dt, s), {"indexer_logits": 1}, kind="logits",
         notes="per-batch k, logits: one op call per batch (static batch)"),
    Case("single_query", single_query, lambda dt, s: _qkw(dt, s, t=1), {"indexer_topk": 1}, outputs="both"),
    Case("where_finfo_ratio", where_finfo_ratio, _qkw, {"indexer_topk": 1}, outputs="both",
         dtypes=(torch.float32, torch.bfloat16)),
    Case("official_upcast_where", official_upcast, make_official(1), {"indexer_topk": 1}, outputs="both",
         dtypes=(torch.bfloat16,)),
    Case("matmul_4d_broadcast", matmul_4d_broadcast, make_official(2), {"indexer_topk": 1}),
    Case("padded_rows_row_condition", padded_rows, _qkw, {"indexer_topk": 1}, outputs="both"),
    Case("tril_keep_bool", tril_keep_bool, _qkw, {"indexer_topk": 1}, outputs="both"),
    Case("tril_float_eq0", tril_float_eq0, _qkw, {"indexer_topk": 1}, outputs="both"),
    Case("tril_inverted_late_start", tril_inverted, _qkw, {"indexer_topk": 1}, outputs="both"),
    Case("logits_finfo_selected", logits_finfo_selected, _qkw, {"indexer_logits": 1}, kind="logits",
         dtypes=(torch.float32, torch.bfloat16)),
    Case("logits_finfo_added_window", logits_finfo_added, _qkw, {"indexer_logits": 1}, kind="logits",
         dtypes=(torch.float32, torch.bfloat16)),
    Case("v32_style_index_put_int32", v32_style_index_put, _qkw, {"indexer_topk": 1}),
    Case("transformers_mask_4d_select", transformers_mask_4d, _qkw, {"indexer_topk": 1}),


    Case("data_bool_mask_tk", data_bool_tk, _with_data((T, K)), {"indexer_topk": 1}, outputs="both"),
    Case("data_bool_mask_1tk_broadcast", data_bool_broadcast_1tk, _with_data((1, T, K)), {"indexer_topk": 1},
         outputs="both"),
    Case("data_bool_mask_transposed_kt", data_bool_transposed, _with_data((K, T)), {"indexer_topk": 1},
         outputs="both"),
    Case("data_additive_bias_tk", data_additive_tk, _with_data((T, K), additive=True), {"indexer_topk": 1},
         outputs="both", dtypes=(torch.float32, torch.bfloat16)),
    Case("causal_range_and_data_padding", causal_and_data_padding, _with_data((K,)), {"indexer_topk": 1},
         outputs="both"),
    Case("causal_range_and_int_padding", causal_and_int_padding, _with_data((K,)), {"indexer_topk": 1},
         outputs="both"),
    Case("data_mask_index_put", data_index_put, _with_data((T, K)), {"indexer_topk": 1}, outputs="both"),
    Case("data_mask_per_batch_kv", data_mask_per_batch_kv, _per_batch_data, {"indexer_topk": 1}, outputs="both"),
    Case("per_key_bias_logits", per_key_bias_logits, _qkw, {"indexer_logits": 1}, kind="logits"),
    Case("decode_dense_gather_context_lens", decode_dense_gather, make_decode, {"indexer_topk": 1},
         outputs="both", dtypes=(torch.float32, torch.bfloat16),
         notes="key dim = (page, offset): the mask is read through the linear key index"),
]


# ---- near-misses: each must be left exactly as it is --------------------------------------------
def _s(q, k):
    return torch.einsum("thd,kd->thk", q, k)


def _causal(n_q, n_k):
    return torch.arange(n_k).unsqueeze(0) > torch.arange(n_q).unsqueeze(1)


def nm_weights_before_relu(q, k, w):
    return (_s(q, k) * w.unsqueeze(-1)).relu().sum(1).topk(4)


def nm_abs(q, k, w):
    return (_s(q, k).abs() * w.unsqueeze(-1)).sum(1).topk(4)


def nm_gelu(q, k, w):
    return (F.gelu(_s(q, k)) * w.unsqueeze(-1)).sum(1)


def nm_smallest(q, k, w):
    return (_s(q, k).relu() * w.unsqueeze(-1)).sum(1).topk(4, largest=False)


def nm_per_key_weights(q, k, w):
    wk = k.sum(-1)  # one weight per key
    return (_s(q, k).relu() * w.unsqueeze(-1) * wk).sum(1)


def nm_sum_over_keys(q, k, w):
    return (_s(q, k).relu() * w.unsqueeze(-1)).sum(-1).topk(2)


def nm_mask_zero(q, k, w):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    return s.masked_fill(_causal(q.shape[0], k.shape[0]), 0.0).topk(4)


def nm_mask_large_negative(q, k, w):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    return (s - 1e4 * _causal(q.shape[0], k.shape[0]).float()).topk(4)


def nm_mask_union(q, k, w):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    c, r = torch.arange(k.shape[0]).unsqueeze(0), torch.arange(q.shape[0]).unsqueeze(1)
    return s.masked_fill((c > 2) & (c < r), float("-inf")).topk(4)


def nm_mask_even_cols(q, k, w):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    c = torch.arange(k.shape[0]).unsqueeze(0)
    return s.masked_fill(c % 2 == 1, float("-inf")).topk(4)


def nm_mask_ne(q, k, w):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    c, r = torch.arange(k.shape[0]).unsqueeze(0), torch.arange(q.shape[0]).unsqueeze(1)
    return s.masked_fill(c == r, float("-inf")).topk(4)  # hides one column: not a range


def nm_negative_scale(q, k, w):
    return ((-_s(q, k)).relu() * w.unsqueeze(-1)).sum(1)


def nm_per_head_k(q, k, w):
    kh = k.unsqueeze(1) * torch.arange(1, q.shape[1] + 1).view(1, -1, 1)  # [K, H, D]
    return (torch.einsum("thd,khd->thk", q, kh).relu() * w.unsqueeze(-1)).sum(1)


def nm_relu_after_sum(q, k, w):
    return (_s(q, k) * w.unsqueeze(-1)).sum(1).relu()


def nm_mask_before_relu(q, k, w):
    s = _s(q, k).masked_fill(_causal(q.shape[0], k.shape[0]).unsqueeze(1), float("-inf"))
    return (s.relu() * w.unsqueeze(-1)).sum(1).topk(4)


def nm_topk_over_rows(q, k, w):
    return (_s(q, k).relu() * w.unsqueeze(-1)).sum(1).topk(3, dim=0)


def _fill(value):
    """A causal masked_fill with a finite (or positive) ``value`` instead of -inf."""
    def fn(q, k, w):
        s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
        return s.masked_fill(_causal(q.shape[0], k.shape[0]), value).topk(4)
    return fn


def _loud(scale):
    """_qkw with weights times ``scale``: many visible scores fall below a finite fill (they cross it)."""
    return lambda dt, s: (lambda q, k, w: (q, k, w * scale))(*_qkw(dt, s))


def nm_different_fills(q, k, w):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    s = s.masked_fill(_causal(q.shape[0], k.shape[0]), float("-inf"))
    return s.masked_fill(torch.arange(k.shape[0]) < 2, torch.finfo(s.dtype).min).topk(4)


def nm_float_mask_multiplied(q, k, w):
    s = (_s(q, k).relu() * w.unsqueeze(-1)).sum(1)
    keep = torch.tril(torch.ones(q.shape[0], k.shape[0]))
    return (s * keep).topk(4)  # masked scores become 0, not -inf


def nm_decode_in_page_mask(q, k_cache, weights, block_table, context_lens):
    bsz, _, _, d = q.shape
    page = k_cache.shape[1]
    k = k_cache[block_table].reshape(bsz, -1, d)
    logits = (torch.einsum("bnhd,bld->bnhl", q, k).relu() * weights.unsqueeze(-1)).sum(2)
    pos = torch.arange(k.shape[1])
    offset = pos - page * (pos // page)  # position inside its page
    return logits.masked_fill(offset >= 4, float("-inf")).topk(4)  # 4 keys of every page


def nm_head_dim_24(q, k, w):
    return (_s(q, k).relu() * w.unsqueeze(-1)).sum(1).topk(4)  # the kernels need 2^n head_dim


def nm_bias_per_head(q, k, w, bias):
    s = _s(q, k).relu() + bias.view(T, 1, K) * torch.arange(1, H + 1).view(1, H, 1)  # differs per head
    return (s * w.unsqueeze(-1)).sum(1).topk(4)


def nm_bias_before_weighting(q, k, w, bias):
    s = _s(q, k).relu() + bias.unsqueeze(1)  # added before the weights: sum_h w * bias is not bias
    return (s * w.unsqueeze(-1)).sum(1).topk(4)


def _with_bias(dt, s):
    return (*_qkw(dt, s), torch.randn(T, K, generator=torch.Generator().manual_seed(s + 3)).to(dt))


def nm_tensor_scale_in_relu(q, k, w):
    c = w[:, :1].unsqueeze(-1)  # a per-row factor of unknown sign inside the relu
    return torch.matmul(w.unsqueeze(-2), torch.relu(_s(q, k) * c)).squeeze(-2).topk(4)


NEAR_MISSES = [
    Case("weights_before_relu", nm_weights_before_relu, _qkw, {}, reject="before relu"),
    Case("abs_instead_of_relu", nm_abs, _qkw, {}, reject="no relu"),
    Case("gelu_instead_of_relu", nm_gelu, _qkw, {}, kind="logits"),
    Case("largest_false", nm_smallest, _qkw, {}, reject="largest=False"),
    Case("per_key_weights", nm_per_key_weights, _qkw, {}, kind="logits", reject="per-key"),
    Case("sum_over_keys", nm_sum_over_keys, _qkw, {}),
    Case("mask_fill_zero", nm_mask_zero, _qkw, {}, reject="fill value 0.0"),
    Case("mask_large_negative_product", nm_mask_large_negative, _qkw, {}),
    Case("mask_union_not_a_range", nm_mask_union, _qkw, {}, reject="union"),
    Case("mask_even_columns", nm_mask_even_cols, _qkw, {}),
    Case("mask_single_column_hidden", nm_mask_ne, _qkw, {}, reject="not a range"),
    Case("negative_scale_before_relu", nm_negative_scale, _qkw, {}, kind="logits"),
    Case("per_head_k", nm_per_head_k, _qkw, {}, kind="logits", reject="per-head k"),
    Case("relu_after_head_sum", nm_relu_after_sum, _qkw, {}, kind="logits"),
    Case("mask_before_relu", nm_mask_before_relu, _qkw, {}),
    Case("topk_over_rows", nm_topk_over_rows, _qkw, {}),
    Case("bias_differs_per_head", nm_bias_per_head, _with_bias, {}, reject="not over relu(q.k) * weights"),
    Case("bias_added_before_weighting", nm_bias_before_weighting, _with_bias, {},
         reject="not over relu(q.k) * weights"),
    Case("tensor_scale_inside_relu", nm_tensor_scale_in_relu, _qkw, {}, reject="unknown sign"),
    Case("two_masks_different_fills", nm_different_fills, _qkw, {}, reject="different fill"),
    # finite fills that visible scores cross: top-k then picks masked columns, which the op never
    # does, so only -inf (or the scores' own finfo.min, which nothing finite crosses) may match
    Case("mask_fill_minus_1e9", _fill(-1e9), _loud(1e11), {}, reject="fill value -1000000000.0"),
    Case("mask_fill_minus_1e4", _fill(-1e4), _loud(1e6), {}, reject="fill value -10000.0"),
    Case("mask_fill_fp16_min_on_fp32", _fill(torch.finfo(torch.float16).min), _loud(1e7), {},
         reject="fill value -65504.0"),
    Case("mask_fill_large_positive", _fill(1e30), _qkw, {}, reject="fill value 1e+30"),
    Case("float_mask_multiplied", nm_float_mask_multiplied, _qkw, {}),
    Case("decode_in_page_mask", nm_decode_in_page_mask, make_decode, {}, reject="uses the column index"),
    Case("unsupported_head_dim_24", nm_head_dim_24, lambda dt, s: _qkw(dt, s, d=24), {}, reject="power of two"),
]

