"""Paged (decode) indexer test helpers shared by several test modules: random paged caches
(``make_case``), moving a case to the device under test, running the op, the float64 oracle, the
top-k check against it, and the sequence-split configs the ``split`` fixture (conftest.py) forces."""
import torch

import inductor_dsa as idsa
from inductor_dsa import formats, reference
from conftest import DEVICE

PAGE = formats.PAGE_ROWS


def fp8_flavor_for(fmt, flavor):
    """The fp8 flavor to pass for ``fmt`` (MXFP4 ignores it: "fn")."""
    return flavor if fmt == "fp8" else "fn"


def make_case(gen, *, fmt="mxfp4", flavor="fn", b=4, n=2, h=8, d=64, max_pages=3, ctx=None,
              shared=True, q_mxfp4=False, ints=False):
    """(q, kv_cache, weights, block_table, context_lens) on the CPU.

    Pages are shuffled, requests 1 and 2 share their first page when ``shared``, block-table
    entries past the context hold garbage ids (-1, huge, random), unused rows hold random bytes."""
    ctx = torch.tensor(ctx if ctx is not None else [0, 1, 65, 190][:b], dtype=torch.int32)
    b = ctx.numel()
    live = [min(max(int(c), 0), max_pages * PAGE) for c in ctx]
    n_used = [-(-c // PAGE) for c in live]
    num_pages = sum(n_used) + 2  # two pages nobody references
    a, s = formats.row_bytes(fmt, d)
    cache = torch.randint(0, 256, (num_pages, PAGE * (a + s)), generator=gen, dtype=torch.uint8)
    perm = torch.randperm(num_pages, generator=gen).tolist()
    bt = torch.randint(-5, 10**6, (b, max_pages), generator=gen, dtype=torch.int32)
    bt[:, -1] = -1
    seen = {}  # page -> rows some request can see
    for i, k in enumerate(n_used):
        for p in range(k):
            if shared and i == 2 and p == 0 and n_used[1] > 0:
                bt[i, p] = bt[1, 0]  # prefix sharing: the same physical page
            else:
                bt[i, p] = perm.pop()
            pg = int(bt[i, p])
            seen[pg] = max(seen.get(pg, 0), min(PAGE, live[i] - p * PAGE))
    # referenced pages: real encodings in the rows someone sees, random bytes in the rest
    for pg, rows in seen.items():
        x = torch.randint(-2, 3, (PAGE, d), generator=gen).float() if ints else torch.randn(PAGE, d, generator=gen)
        payload, scale = formats.encode_rows(x, fmt, fp8_flavor_for(fmt, flavor))
        page = formats.pack_pages(payload, scale)[0]
        junk = cache[pg]
        page[: PAGE * a].view(PAGE, a)[rows:] = junk[: PAGE * a].view(PAGE, a)[rows:]
        page[PAGE * a:].view(PAGE, s)[rows:] = junk[PAGE * a:].view(PAGE, s)[rows:]
        cache[pg] = page
    if ints:
        q = torch.randint(-2, 3, (b, n, h, d), generator=gen).bfloat16()
        w = torch.randint(-2, 3, (b, n, h), generator=gen).bfloat16()
    else:
        q = torch.randn(b, n, h, d, generator=gen).bfloat16()
        w = torch.randn(b, n, h, generator=gen)  # signed, like weights_proj output
    if q_mxfp4:
        q = formats.mxfp4_encode(q.float())
    return q, cache, w, bt, ctx


def to_device(x):
    """A tensor, or a (nested) tuple / list of them such as a whole case, moved to DEVICE."""
    if isinstance(x, (tuple, list)):
        return tuple(to_device(y) for y in x)
    return x.to(DEVICE)


def run_paged_topk(case, topk, fmt, flavor, **kw):
    """idsa.paged_indexer_topk on ``case`` moved to DEVICE."""
    q, cache, w, bt, ctx = case
    return idsa.paged_indexer_topk(to_device(q), to_device(cache), to_device(w), to_device(bt), to_device(ctx), topk,
                                   fmt=fmt, fp8_flavor=fp8_flavor_for(fmt, flavor), **kw)


def paged_oracle(case, fmt, flavor):
    """The float64 logits [B, N, L] of ``case`` (reference.paged_indexer_logits)."""
    q, cache, w, bt, ctx = case
    return reference.paged_indexer_logits(q, cache, w, bt, ctx, fmt, fp8_flavor_for(fmt, flavor))


def assert_paged_topk(vals, idx, ref, topk, tol=1e-5):
    """Set-with-tolerance vs the fp64 logits [B, N, L]; values match the oracle at the chosen rows."""
    vals, idx = vals.cpu(), idx.cpu()
    b, n, max_len = ref.shape
    assert vals.shape == idx.shape == (b, n, topk)
    assert vals.dtype == torch.float32 and idx.dtype == torch.int32
    ref2 = ref.reshape(b * n, max_len)
    msg = reference.topk_mismatch(idx.reshape(b * n, topk), ref2, topk)
    assert msg is None, msg
    idx2, vals2 = idx.reshape(b * n, topk), vals.reshape(b * n, topk)
    taken = idx2 >= 0
    assert (vals2[~taken] == float("-inf")).all()
    want = ref2.gather(1, idx2.long().clamp(min=0)).nan_to_num(float("-inf"), float("inf"), float("-inf"))  # NaN reads -inf
    assert torch.equal(torch.isneginf(vals2) & taken, torch.isneginf(want) & taken)
    taken &= torch.isfinite(want)
    fin = ref2[torch.isfinite(ref2)]
    scale = max(fin.abs().max().item(), 1.0) if fin.numel() else 1.0
    assert (torch.where(taken, vals2.double() - want, 0)).abs().max() <= tol * scale
    assert (vals2[:, :-1] >= vals2[:, 1:]).all()  # descending, -inf padding last


# split configs: no split, chunks of 64 rows (bn 32), chunks of 48 rows (bn 16: 4 blocks per page);
# split_min=0: these short test contexts are split on every target
SPLITS = {
    "nosplit": dict(chunk_min=4096, chunk_max=4096),
    "split64": dict(bn=32, chunk_min=64, chunk_max=64, split_min=0),
    "split48-bn16": dict(bn=16, chunk_min=48, chunk_max=48, num_warps=4, split_min=0,
                         hist_span=64,  # several histogram copies per row
                         rank_rows=64),  # the lists' entries placed by list_rank_kernel, no merge
}
