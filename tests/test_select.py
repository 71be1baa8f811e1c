"""The selection engine (kernels/select.py) against the float64 oracle, exactly: every path
(one program per row, sorting in-kernel, by 32-bit keys or 64-bit words, or apart; the sampled
filter, with its fallback forced by misses, overflows and partial ties; chunked passes with a
per-row bitonic sort, or for a few rows the ranked path, its candidates ranked by many programs
or, on overflow, selected by one), odd lengths, long rows, ties, +-0, -inf, NaN of either sign,
subnormals, empty and out-of-range ranges, k above the visible count. On the CPU the
interpreter's config sends rows above 256 columns to the sampled filter when there are at least 4
rows, else to the chunked path, as it does rows of over 64 columns when fewer than 3, the ranked
path at most 2 of them (configs.SELECT["interpreter"])."""
import dataclasses

import pytest
import torch
import triton
from hypothesis import given, strategies as st

import inductor_dsa as idsa
from inductor_dsa import reference
from inductor_dsa.kernels import configs, select_launch
from conftest import DEVICE
from property_settings import examples

TARGET = configs.target_for(torch.device(DEVICE))


def _values(kind, t, n, gen):
    x = torch.randn(t, n, generator=gen)
    if kind == "ties":          # few distinct scores: the tie rule decides most slots
        x = torch.randint(-3, 3, (t, n), generator=gen).float()
    elif kind == "special":     # +-0, +-inf, NaN of either sign and +-subnormals among ties
        vals = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -float("nan"), 1e-40,
                             -1e-40, 1e-45, -1e-45])
        pick = torch.randint(0, len(vals), (t, n), generator=gen)
        x = torch.where(torch.rand(t, n, generator=gen) < 0.7, vals[pick], x.round())
    return x


def _ranges(t, n, gen):
    """Random ranges: some empty or inverted, some past either end, the first row all visible."""
    a = torch.randint(-5, n + 5, (t,), generator=gen, dtype=torch.int32)
    b = torch.randint(-5, n + 5, (t,), generator=gen, dtype=torch.int32)
    s, e = torch.minimum(a, b), torch.maximum(a, b)
    e = torch.where(torch.arange(t) % 4 == 3, s - 1, e)
    s[0], e[0] = 0, n
    return s, e


def _check(x, topk, ks, ke):
    vals, idx = idsa.logits_topk(x.to(DEVICE), topk, k_start=ks.to(DEVICE), k_end=ke.to(DEVICE))
    want_v, want_i = reference.logits_topk(x.double(), topk, ks, ke)
    assert torch.equal(idx.cpu(), want_i.to(torch.int32)), "indices differ from the oracle"
    assert torch.equal(vals.cpu(), want_v.float()), "values differ from the oracle"
    return vals, idx


def _path(rows, n, cfg=None):
    cfg = cfg or configs.SELECT[TARGET]
    if not select_launch.chunked(rows, n, cfg):
        return "row"
    return "filter" if select_launch.filtered(rows, n, cfg) else "chunked"


CASES = [  # rows, n, topk
    (5, 100, 8), (6, 257, 16), (3, 700, 32), (4, 1000, 100), (1, 700, 5), (2, 300, 40), (1, 70, 100),
    (7, 33, 40), (3, 513, 512), (9, 1500, 40), (4, 300, 290),
]


@pytest.mark.parametrize("rows,n,topk", CASES)
@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
def test_logits_topk_exact(rows, n, topk, kind, gen):
    x = _values(kind, rows, n, gen)
    _check(x, topk, *_ranges(rows, n, gen))


@pytest.mark.skipif(TARGET != "interpreter", reason="the GPU configs send these short rows down one path")
def test_both_paths_and_both_sorts_are_exercised():
    """The case list reaches every method of the engine under the interpreter's config."""
    cfg = configs.SELECT[TARGET]
    paths = {(_path(r, n), r <= cfg.rank_rows) for r, n, _ in CASES}
    assert {("row", False), ("filter", False), ("chunked", False), ("chunked", True)} <= paths


@pytest.mark.parametrize("rows,n,topk", [(1, 1 << 20, 2048), (3, 131072, 2048), (64, 65536, 512)])
def test_long_rows(rows, n, topk, gen, monkeypatch):
    """Decode-like and long-history rows. On the CPU a config with 16K-64K-column chunks keeps
    the interpreter fast; the GPU runs its own."""
    if TARGET == "interpreter":
        cfg = dataclasses.replace(configs.SELECT[TARGET], chunk=65536, chunk_min=16384, few_rows=128)
        monkeypatch.setitem(configs.SELECT, TARGET, cfg)
        if rows == 64:
            rows, n = 4, 65536
    x = torch.randn(rows, n, generator=gen)
    x[:, ::1000] = x[:, ::1000].round()  # some exact ties near the threshold
    ks = torch.randint(0, 3, (rows,), generator=gen, dtype=torch.int32)
    ke = torch.full((rows,), n, dtype=torch.int32) - torch.randint(0, 3, (rows,), generator=gen, dtype=torch.int32)
    assert _path(rows, n) != "row"
    _check(x, topk, ks, ke)


def test_plus_minus_zero_and_nan_order():
    x = torch.tensor([[0.0, -0.0, 0.0, -0.0], [float("nan"), float("-inf"), -0.0, float("nan")]])
    v, i = idsa.logits_topk(x.to(DEVICE), 4)
    assert i.tolist() == [[0, 1, 2, 3], [2, 1, 0, 3]]
    assert v[1].tolist() == [0.0, float("-inf"), float("-inf"), float("-inf")]


def test_chunked_is_deterministic(gen):
    """Winners are collected at positions taken from an atomic counter: the sorted result must
    not depend on them (bitwise equal run to run, ties included)."""
    rows, n = (2, 3000) if TARGET == "interpreter" else (4, 300000)
    x = torch.randint(-50, 50, (rows, n), generator=gen).float().to(DEVICE)
    first = idsa.logits_topk(x, 600)
    for _ in range(2):
        again = idsa.logits_topk(x, 600)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@examples(10)
@given(rows=st.integers(1, 5), n=st.integers(1, 600), topk=st.integers(1, 64), kind=st.sampled_from(["normal", "ties", "special"]),
       seed=st.integers(0, 2**31 - 1))
def test_logits_topk_property(rows, n, topk, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    _check(_values(kind, rows, n, gen), topk, *_ranges(rows, n, gen))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA / ROCm GPU")
@pytest.mark.parametrize("rows,n,topk,path", [(3, 100000, 1024, "chunked"), (200, 30000, 512, "filter")])
def test_chunked_graph_capture(rows, n, topk, path, gen):
    """The chunked path and the sampled filter (zeroed state, several launches) capture and
    replay on new data."""
    assert _path(rows, n) == path
    x = torch.randn(rows, n, generator=gen).cuda()
    ks, ke = (r.cuda() for r in reference.full_ranges(rows, n))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        idsa.logits_topk(x, topk, k_start=ks, k_end=ke)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = idsa.logits_topk(x, topk, k_start=ks, k_end=ke)
    x.copy_(torch.randn(rows, n, generator=gen))
    graph.replay()
    want_v, want_i = reference.logits_topk(x.cpu().double(), topk, ks.cpu(), ke.cpu())
    assert torch.equal(out[1].cpu(), want_i.to(torch.int32))


@pytest.mark.parametrize("rows,n,topk", [(5, 100, 8), (4, 250, 100), (3, 256, 255)])
@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
@pytest.mark.parametrize("ch", [None, 2])
def test_packed_histograms_exact(rows, n, topk, kind, ch, gen, monkeypatch):
    """One program per row with the packed-count histograms (an autotuning candidate) equals the
    oracle; ch=2 puts up to 128 counts in one slot's 8-bit field (ties: most in one bin)."""
    cfg = dataclasses.replace(configs.SELECT[TARGET], packed=True, few_rows=1, row_max=256,
                              ch=ch or configs.SELECT[TARGET].ch)
    monkeypatch.setitem(configs.SELECT, TARGET, cfg)
    assert not select_launch.chunked(rows, n, cfg)
    x = _values(kind, rows, n, gen)
    _check(x, topk, *_ranges(rows, n, gen))


def test_packed_histograms_refuse_counts_that_could_overflow():
    with pytest.raises(ValueError, match="255 steps"):
        dataclasses.replace(configs.SELECT[TARGET], packed=True, row_max=256 * 64, ch=64)
    with pytest.raises(ValueError, match="bits=8"):
        dataclasses.replace(configs.SELECT[TARGET], packed=True, bits=8)


@pytest.mark.parametrize("rows,n,topk", [(5, 100, 8), (4, 250, 100), (7, 33, 40), (6, 256, 64), (3, 200, 255)])
@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
def test_sort_apart_exact(rows, n, topk, kind, gen, monkeypatch):
    """One program per row leaving its winners unsorted for ``sort_rows_kernel`` (top-k at or
    above ``sort_apart``) equals the oracle, padded slots included."""
    cfg = dataclasses.replace(configs.SELECT[TARGET], sort_apart=1, few_rows=1, row_max=256)
    monkeypatch.setitem(configs.SELECT, TARGET, cfg)
    assert not select_launch.chunked(rows, n, cfg)
    _check(_values(kind, rows, n, gen), topk, *_ranges(rows, n, gen))


@pytest.mark.parametrize("rows,n,topk", [(5, 200, 64), (3, 150, 100)])
@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
@pytest.mark.parametrize("sort32", [True, False])
def test_in_kernel_sort_exact(rows, n, topk, kind, sort32, gen, monkeypatch):
    """The winners sorted in the selecting kernel equal the oracle with either ordering: 32-bit
    keys with each column placed at its key's rank (a row with a repeated key, as most "ties"
    and "special" rows have, takes 64-bit words), or 64-bit (key, column) words throughout."""
    cfg = dataclasses.replace(configs.SELECT[TARGET], sort32=sort32, sort_apart=1 << 20, few_rows=1, row_max=256)
    monkeypatch.setitem(configs.SELECT, TARGET, cfg)
    assert _path(rows, n, cfg) == "row"
    _check(_values(kind, rows, n, gen), topk, *_ranges(rows, n, gen))


def _keys(x):
    """select.sel_key on the CPU (int64): 2**31 +- the magnitude bits, NaN 0."""
    bits = x.float().view(torch.int32).to(torch.int64)
    mag = bits & 0x7FFFFFFF
    return torch.where(mag > 0x7F800000, 0, torch.where(bits < 0, 2**31 - mag, 2**31 + mag))


def _ranked_candidates(row, topk, prefix_bits):
    """The ranked path's candidate count for one fully visible row: the keys whose top prefix_bits
    reach those of the k-th largest key (all of them when the row has at most topk)."""
    keys = _keys(row)
    if keys.numel() <= topk:
        return keys.numel()
    top = keys >> (32 - prefix_bits)
    return int((top >= top.sort(descending=True).values[topk - 1]).sum())


@pytest.mark.parametrize("kind,cap,overflow", [("normal", 64, False), ("ties", 1, True), ("special", 1, None),
                                               ("normal", 1, None)])
def test_ranked_path_ranks_or_falls_back(kind, cap, overflow, gen, monkeypatch):
    """Few long rows (the ranked path): candidates at or above the passes' 16-bit threshold prefix
    ranked by many programs, or, when they overflow their slots (runs of equal scores at the
    threshold), the row selected below that prefix by one program; both equal the oracle. The
    candidate count, computed here, shows that the first case ranks and the second falls back."""
    rows, n, topk = (2, 700, 20) if TARGET == "interpreter" else (2, 5000, 300)
    cfg = dataclasses.replace(configs.SELECT[TARGET], rank_cap=cap)
    monkeypatch.setitem(configs.SELECT, TARGET, cfg)
    assert select_launch.chunked(rows, n, cfg) and rows <= cfg.rank_rows
    x = _values(kind, rows, n, gen)
    slots = select_launch.rank_cap(topk, cfg)
    over = [_ranked_candidates(r, topk, cfg.rank_passes * cfg.pass_bits) > slots for r in x]
    if overflow is not None:
        assert over == [overflow] * rows
    _check(x, topk, *reference.full_ranges(rows, n))


@pytest.mark.parametrize("m,topk", [(300, 64), (40, 64), (700, 600)])
def test_packed_entries_rank_in_any_order(m, topk, gen):
    """``list_rank_kernel`` (the paged ranked path; ``place_ranked`` also serves ``cand_rank_kernel``)
    places packed (key, column) entries by rank: the same output whatever order the chunks packed
    them in (on the GPU that order follows timing; the interpreter's is fixed, so it is shuffled
    here), equal to a sort by descending key, then column, and -inf / -1 padded past the count."""
    from inductor_dsa.kernels.select_hist import RANK_STATE, list_rank_kernel
    keys = torch.randint(0x3F000000, 0x3F000000 + 50, (m,), generator=gen, dtype=torch.int64)  # many ties
    cols = torch.randperm(10 * m, generator=gen)[:m]
    order = sorted(range(m), key=lambda j: (-int(keys[j]), int(cols[j])))[:topk]
    got = []
    for _ in range(2):
        perm = torch.randperm(m, generator=gen)
        state = torch.tensor([[m, 1, 0, 0, m] + [0] * (RANK_STATE.value - 5)], dtype=torch.int32)
        out_v = torch.empty((1, topk), dtype=torch.float32)
        out_i = torch.empty((1, topk), dtype=torch.int32)
        args = [keys[perm].to(torch.int32), cols[perm].to(torch.int32), state, out_v, out_i]
        k_, c_, state, out_v, out_i = [a.to(DEVICE) for a in args]
        unused = out_i  # the merge fallback's operands (a row of at most RANK_MAX entries is ranked)
        list_rank_kernel[(1, 4)](unused, unused, unused, unused, unused, unused, unused, k_, c_, state, out_v, out_i,
                                 1, m, LIST_SIZE=m, TOPK=topk, TOPK_P2=triton.next_power_of_2(topk), SLICE=8,
                                 TILE=64, BLOCK_SELECT=64, S_P2=1, BLOCK_COPY=64, HIST_COPIES=1, FINE=False, BITS=8)
        got.append((out_v.cpu(), out_i.cpu()))
    want_i = torch.full((topk,), -1, dtype=torch.int32)
    want_i[:len(order)] = cols[order].to(torch.int32)
    assert torch.equal(got[0][1][0], want_i) and torch.equal(got[1][1][0], want_i)
    assert torch.equal(got[0][0], got[1][0])
    assert torch.isinf(got[0][0][0, len(order):]).all()


FILTER_CASES = [(4, 300, 8), (6, 1000, 100), (5, 257, 200), (8, 1100, 33), (4, 700, 700)]


def _filter_cfg(monkeypatch, **changes):
    cfg = dataclasses.replace(configs.SELECT[TARGET], filter_rows=4, row_max=256, **changes)
    monkeypatch.setitem(configs.SELECT, TARGET, cfg)
    return cfg


@pytest.mark.parametrize("rows,n,topk,route", [c + ("filter",) for c in FILTER_CASES]
                         + [c + (r,) for c in FILTER_CASES[1:3] for r in ("miss", "overflow", "small")])
@pytest.mark.parametrize("kind", ["normal", "ties", "special"])
def test_sampled_filter_exact(rows, n, topk, route, kind, gen, monkeypatch):
    """The sampled filter equals the oracle whichever way a row goes: its own select, or the
    chunked passes after a sample that misses (bound above the k-th key), candidates that
    overflow their slots, or a partial tie at the threshold (the "ties" and "special" kinds)."""
    changes = {"filter": {}, "miss": dict(sample_z=-100.0), "overflow": dict(sample_z=1e4),
               "small": dict(sample=16, cand_factor=1)}[route]
    cfg = _filter_cfg(monkeypatch, **changes)
    assert _path(rows, n, cfg) == "filter"
    _check(_values(kind, rows, n, gen), topk, *_ranges(rows, n, gen))


@pytest.mark.parametrize("route,fallback", [("filter", False), ("miss", True), ("overflow", True), ("tie", True)])
def test_sampled_filter_route(route, fallback, gen, monkeypatch):
    """Continuous scores are selected by the filter itself, with no row left to the fallback (a
    filter that always fell back would be exact but slow); a miss, an overflow and a partial tie
    each send the row to the chunked passes."""
    rows, n, topk = (6, 2000, 64) if TARGET == "interpreter" else (300, 40000, 512)
    # 8 x k candidate slots: at 2000 columns a 256-key sample's bound overflowed 4 x k in ~0.3% of rows
    cfg = _filter_cfg(monkeypatch, sample_z={"miss": -100.0, "overflow": 1e4}.get(route, 4.0), cand_factor=8)
    x = torch.randn(rows, n, generator=gen)
    if route == "tie":  # every row: the threshold falls inside a run of equal scores
        x[:, : 2 * topk] = 100.0
    if route == "miss":  # the sampled columns hold each row's largest scores: a certain miss (with
        x[:, torch.arange(cfg.sample) * n // cfg.sample] += 100.0  # plain random rows, ~1e-4 escape it)
    ks, ke = reference.full_ranges(rows, n)
    x, ks, ke = x.to(DEVICE), ks.to(DEVICE), ke.to(DEVICE)
    out_v = torch.empty((rows, topk), dtype=torch.float32, device=DEVICE)
    out_i = torch.empty((rows, topk), dtype=torch.int32, device=DEVICE)
    redo = select_launch.select(x, 0, rows, rows, n, ks, ke, out_v, out_i, topk, cfg)
    listed = redo[1:1 + int(redo[0])].cpu().sort().values
    assert torch.equal(listed, torch.arange(rows, dtype=torch.int32) if fallback else listed[:0])
    want_v, want_i = reference.logits_topk(x.cpu().double(), topk, ks.cpu(), ke.cpu())
    assert torch.equal(out_i.cpu(), want_i.to(torch.int32)) and torch.equal(out_v.cpu(), want_v.float())


@examples(8)
@given(rows=st.integers(4, 7), n=st.integers(257, 900), topk=st.integers(1, 300),
       kind=st.sampled_from(["normal", "ties", "special"]), z=st.floats(-3.0, 6.0), seed=st.integers(0, 2**31 - 1))
def test_sampled_filter_property(rows, n, topk, kind, z, seed):
    cfg = dataclasses.replace(configs.SELECT[TARGET], filter_rows=4, row_max=256, sample_z=z)
    gen = torch.Generator().manual_seed(seed)
    old = configs.SELECT[TARGET]
    configs.SELECT[TARGET] = cfg
    try:
        _check(_values(kind, rows, n, gen), topk, *_ranges(rows, n, gen))
    finally:
        configs.SELECT[TARGET] = old
