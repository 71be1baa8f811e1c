"""64-bit addressing of the paged kernels: a key cache larger than 2**31 bytes, pages at its end.

A small case (``paged_cases.make_case``) is moved into a big cache, ``torch.empty`` (left
uninitialised: only the used pages are written, so the CPU never touches the rest), at page ids
whose byte offsets start just below 2**31 (the first page straddles it) and run past it. Any
page id x page stride (or row x row bytes) computed in int32 wraps there and reads the wrong
bytes; results must equal the oracle's on the small cache. On the CPU the interpreter emulates
int32 arithmetic (numpy wraps), so this checks the kernels' integer widths there too.
The long-context test (2**20 rows, the longest context the kernels take) runs on a GPU only:
under the interpreter its million-row select would take many minutes.
"""
import pytest
import torch

import inductor_dsa as idsa
from inductor_dsa import formats, reference
from conftest import DEVICE
from paged_cases import assert_paged_topk, fp8_flavor_for, make_case, paged_oracle

PAGE = formats.PAGE_ROWS
TWO_GIB = 2**31


def _into_big_cache(case, extra_pages=2):
    """(case moved into a cache of > 2**31 bytes at page ids from floor(2**31 / page bytes) on, big cache)."""
    q, cache, w, bt, ctx = case
    page_bytes = cache.shape[1]
    base = TWO_GIB // page_bytes  # this page starts below 2**31 and ends past it
    big = torch.empty((base + cache.shape[0] + extra_pages, page_bytes), dtype=torch.uint8, device=DEVICE)
    assert big.numel() > TWO_GIB and base * page_bytes < TWO_GIB < (base + 1) * page_bytes
    big[base:base + cache.shape[0]] = cache.to(DEVICE)
    used = torch.arange(bt.shape[1]) * PAGE < ctx.clamp(min=0).unsqueeze(1).long()
    bt_big = torch.where(used, bt + base, bt)  # entries past the context keep their garbage
    return (q.to(DEVICE), big, w.to(DEVICE), bt_big.to(DEVICE), ctx.to(DEVICE)), big


@pytest.mark.parametrize("fmt,flavor", [("mxfp4", "fn"), ("fp8", "fn")])
def test_topk_and_logits_on_pages_past_2gib(fmt, flavor, gen):
    case = make_case(gen, fmt=fmt, flavor=flavor, b=3, n=1, h=4, d=64, ctx=[190, 65, 130])
    (q, big, w, bt, ctx), _ = _into_big_cache(case)
    ref = paged_oracle(case, fmt, flavor)
    vals, idx = idsa.paged_indexer_topk(q, big, w, bt, ctx, 24, fmt=fmt, fp8_flavor=fp8_flavor_for(fmt, flavor))
    assert_paged_topk(vals, idx, ref, 24)
    out = idsa.paged_indexer_logits(q, big, w, bt, ctx, fmt=fmt, fp8_flavor=fp8_flavor_for(fmt, flavor)).cpu()
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), fin) and (out[~fin] == float("-inf")).all()
    assert (out.double() - ref)[fin].abs().max() <= 1e-5 * ref[fin].abs().max()


def test_gather_on_pages_past_2gib(gen):
    case = make_case(gen, b=3, n=1, h=4, d=64, ctx=[190, 65, 130])
    (_, big, _, bt, ctx), _ = _into_big_cache(case)
    (codes, scales), k_start, k_end = idsa.paged_gather(big, bt, ctx)
    payload, scale = formats.unpack_pages(case[1], "mxfp4", 64)  # rows [pages * 64, bytes] of the small cache
    for b, n in enumerate(case[4].tolist()):
        j = torch.arange(n)
        rows = case[3][b, j // PAGE].long() * PAGE + j % PAGE
        s, e = int(k_start[b]), int(k_end[b])
        assert e - s == n
        assert torch.equal(codes[s:e].cpu(), payload[rows]) and torch.equal(scales[s:e].cpu(), scale[rows])


@pytest.mark.skipif(DEVICE == "cpu", reason="2**20-row context: minutes under the CPU interpreter; GPU only")
def test_million_row_context_past_2gib(gen):
    """One request of 2**20 rows (16384 pages, in shuffled order) in the last pages of a > 2**31-byte
    MXFP4 cache, D = 128: top-2048 against the oracle (set with tolerance)."""
    d, rows, topk = 128, 2**20, 2048
    pages = rows // PAGE
    page_bytes = PAGE * sum(formats.row_bytes("mxfp4", d))
    num_pages = max(TWO_GIB // page_bytes + 1, pages) + 1
    x = torch.randn(rows, d, generator=gen)
    small = formats.pack_pages(*formats.encode_rows(x, "mxfp4"))  # [pages, page_bytes]
    big = torch.empty((num_pages, page_bytes), dtype=torch.uint8, device=DEVICE)
    order = torch.randperm(pages, generator=gen)
    ids = num_pages - pages + order  # the last pages of the cache, shuffled
    big[ids.to(DEVICE)] = small.to(DEVICE)
    bt = ids.to(torch.int32).view(1, pages)
    ctx = torch.tensor([rows - 3], dtype=torch.int32)
    q = torch.randn(1, 1, 8, d, generator=gen).bfloat16()
    w = torch.randn(1, 1, 8, generator=gen).bfloat16()
    vals, idx = idsa.paged_indexer_topk(q.to(DEVICE), big, w.to(DEVICE), bt.to(DEVICE), ctx.to(DEVICE), topk)
    small_bt = torch.arange(pages, dtype=torch.int32).view(1, pages)  # the same rows, in the small cache
    ref = reference.paged_indexer_logits(q.to(DEVICE), small.to(DEVICE), w.to(DEVICE), small_bt.to(DEVICE),
                                         ctx.to(DEVICE), "mxfp4")
    assert_paged_topk(vals, idx, ref.cpu(), topk)
