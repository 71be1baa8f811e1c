"""Autotuning of kernel configs (kernels/autotune.py): chosen by the (stubbed) timer, cached in
memory and on disk, reloaded, robust to corrupt and stale cache files, never tuned during capture,
and never changing results. Real kernels run under the interpreter (or on the GPU) where cheap."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import inductor_dsa
from inductor_dsa.kernels import autotune, configs
from conftest import DEVICE

TARGET = configs.target_for(torch.device(DEVICE))
SHIPPED = {configs.describe(t[TARGET]) for t in (configs.INDEXER_LOGITS, configs.SELECT, configs.PAGED,
                                                 configs.SPARSE_ATTENTION)}


@pytest.fixture(autouse=True)
def tuning(tmp_path, monkeypatch):
    """Tuning on, a private Inductor cache dir, empty in-memory state; all undone afterwards."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    autotune.clear()
    autotune.autotune(True)
    yield tmp_path
    autotune.autotune(None)
    autotune.clear()


def prefer_candidates(fn):
    """A timer stub: any non-shipped config is faster (fn.args[0] is the config being timed)."""
    fn()
    return 2.0 if configs.describe(fn.args[0]) in SHIPPED else 1.0


def fails(fn):
    raise AssertionError("tuned although a winner was cached")


SEL = configs.SELECT[TARGET]
SEL_CANDS = configs.candidates("select", TARGET, SEL)
KEY = (8, 64, 4)


def pick(run=lambda cfg: (torch.zeros(1),)):
    return autotune.pick("select", TARGET, torch.device(DEVICE), SEL, KEY, run)


def entry_files(tmp_path):
    d = os.path.join(tmp_path, "inductor_dsa", "autotune")
    return [os.path.join(d, f) for f in os.listdir(d)] if os.path.isdir(d) else []


def test_picks_the_fastest_by_the_timer(monkeypatch):
    times = {configs.describe(c): float(len(SEL_CANDS) - i) for i, c in enumerate(SEL_CANDS)}  # last fastest
    monkeypatch.setattr(autotune, "timer", lambda fn: times[configs.describe(fn.args[0])])
    assert pick() == SEL_CANDS[-1]
    (choice,) = autotune.used()
    assert choice.status == "tuned" and len(choice.times) == len(SEL_CANDS)
    monkeypatch.setattr(autotune, "timer", fails)
    assert pick() == SEL_CANDS[-1]  # in memory


def test_a_win_within_the_noise_keeps_the_shipped_config(monkeypatch):
    times = {configs.describe(c): 1.0 if c is SEL else 0.99 for c in SEL_CANDS}  # 1% faster: noise
    monkeypatch.setattr(autotune, "timer", lambda fn: times[configs.describe(fn.args[0])])
    assert pick() is SEL
    times[configs.describe(SEL_CANDS[-1])] = 0.97  # 3% faster: a win
    run = lambda cfg: (torch.zeros(1),)
    assert autotune.pick("select", TARGET, torch.device(DEVICE), SEL, (16, 64, 4), run) is SEL_CANDS[-1]


def test_equal_times_keep_the_shipped_config(monkeypatch):
    monkeypatch.setattr(autotune, "timer", lambda fn: 1.0)
    assert pick() is SEL


def test_off_means_shipped_and_no_timing(monkeypatch):
    autotune.autotune(False)
    monkeypatch.setattr(autotune, "timer", fails)
    assert pick(run=lambda cfg: pytest.fail("ran a candidate")) is SEL
    assert [c.status for c in autotune.used()] == ["shipped (autotune off)"]


def test_switch(monkeypatch):
    autotune.autotune(None)
    monkeypatch.setattr(autotune, "_max_autotune", False)
    monkeypatch.delenv("INDUCTOR_DSA_AUTOTUNE", raising=False)
    assert not autotune.enabled()
    monkeypatch.setenv("INDUCTOR_DSA_AUTOTUNE", "1")
    assert autotune.enabled()
    monkeypatch.setenv("INDUCTOR_DSA_AUTOTUNE", "0")
    autotune.request_max_autotune()
    assert not autotune.enabled()  # the env var wins over max-autotune
    monkeypatch.delenv("INDUCTOR_DSA_AUTOTUNE")
    assert autotune.enabled()
    inductor_dsa.autotune(False)
    assert not autotune.enabled()


def test_backend_max_autotune_turns_tuning_on(monkeypatch):
    import torch._inductor.compile_fx
    from inductor_dsa import lowering
    autotune.autotune(None)
    monkeypatch.delenv("INDUCTOR_DSA_AUTOTUNE", raising=False)
    monkeypatch.setattr(autotune, "_max_autotune", False)
    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", lambda gm, inputs, **kw: gm)
    lowering.backend(None, [], mode="reduce-overhead")
    assert not autotune.enabled()
    lowering.backend(None, [], mode="max-autotune")
    assert autotune.enabled()


def test_winner_persists_across_clear_and_processes(monkeypatch, tuning):
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    won = pick()
    assert won != SEL and len(entry_files(tuning)) == 1
    autotune.clear()
    monkeypatch.setattr(autotune, "timer", fails)
    assert pick() == won and autotune.used()[0].status == "cached"
    code = ("import torch; from inductor_dsa.kernels import autotune, configs\n"
            "autotune.timer = lambda fn: 1 / 0\n"
            f"cfg = autotune.pick('select', {TARGET!r}, torch.device({DEVICE!r}), configs.SELECT[{TARGET!r}], "
            f"{KEY!r}, lambda c: (torch.zeros(1),))\n"
            "print(configs.describe(cfg), '|', autotune.used()[0].status)")
    env = dict(os.environ, PYTHONPATH=os.getcwd(), INDUCTOR_DSA_AUTOTUNE="1", TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{configs.describe(won)} | cached"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not a dict", "bad config"])
def test_corrupt_cache_entry_is_ignored(monkeypatch, tuning, damage, caplog):
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    won = pick()
    (path,) = entry_files(tuning)
    text = open(path).read()
    entry = json.loads(text)
    bad = {"garbage": "\x00{not json", "truncated": text[: len(text) // 2], "not a dict": "[1, 2]",
           "bad config": json.dumps(dict(entry, config=dict(entry["config"], num_warps="eight")))}[damage]
    with open(path, "w") as f:
        f.write(bad)
    autotune.clear()
    monkeypatch.setattr(autotune, "timer", lambda fn: 1.0)  # everything equal now: the shipped config wins
    with caplog.at_level("DEBUG", logger="inductor_dsa.autotune"):
        assert pick() is SEL
    assert "ignored" in caplog.text and autotune.used()[0].status == "tuned"
    assert json.load(open(path))["config"] == dataclasses.asdict(SEL)  # rewritten, valid
    assert won != SEL


@pytest.mark.parametrize("stale", ["triton", "source", "device", "not a candidate"])
def test_stale_cache_entry_is_ignored(monkeypatch, tuning, stale):
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    pick()
    (path,) = entry_files(tuning)
    entry = json.load(open(path))
    if stale == "not a candidate":
        entry["config"] = dataclasses.asdict(dataclasses.replace(SEL, num_warps=2))
    else:
        entry[stale] = "something else"
    with open(path, "w") as f:
        json.dump(entry, f)
    autotune.clear()
    monkeypatch.setattr(autotune, "timer", lambda fn: 1.0)
    assert pick() is SEL and autotune.used()[0].status == "tuned"


def test_new_source_hash_retunes(monkeypatch):
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    pick()
    autotune.clear()
    monkeypatch.setattr(autotune, "source_hash", lambda: "edited kernels")
    monkeypatch.setattr(autotune, "timer", lambda fn: 1.0)
    assert pick() is SEL


def test_never_tunes_during_capture(monkeypatch):
    monkeypatch.setattr(autotune, "capturing", lambda: True)
    monkeypatch.setattr(autotune, "timer", fails)
    assert pick(run=lambda cfg: pytest.fail("ran while capturing")) is SEL
    assert autotune.used()[0].status == "shipped (capturing, not tuned)"
    monkeypatch.setattr(autotune, "capturing", lambda: False)
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    won = pick()  # tuned outside capture
    monkeypatch.setattr(autotune, "capturing", lambda: True)
    monkeypatch.setattr(autotune, "timer", fails)
    assert pick() == won  # the cached winner during capture
    autotune.clear()
    assert pick() == won  # ... also from disk


def test_rejects_a_candidate_whose_result_differs(monkeypatch):
    def run(cfg):
        idx = torch.arange(4, dtype=torch.int32)
        return (torch.ones(4), idx if cfg is SEL else idx.flip(0))  # same values, other indices
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    assert pick(run) is SEL
    (choice,) = autotune.used()
    assert len(choice.rejected) == len(SEL_CANDS) - 1 and all("differs" in r for r in choice.rejected.values())


def test_rejects_a_candidate_that_fails(monkeypatch):
    def run(cfg):
        if cfg is not SEL:
            raise RuntimeError("out of resources: shared memory")
        return (torch.zeros(1),)
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    assert pick(run) is SEL
    assert "out of resources" in next(iter(autotune.used()[0].rejected.values()))


def test_agrees():
    a = torch.tensor([1.0, float("-inf"), float("nan"), 1000.0])
    assert autotune.agrees((a,), (a + torch.tensor([0.05, 0, 0, 0]),))      # within 1e-4 * max|a|
    assert not autotune.agrees((a,), (a + torch.tensor([0.5, 0, 0, 0]),))
    assert not autotune.agrees((a,), (a.nan_to_num(nan=0.0),))              # NaN moved
    assert not autotune.agrees((a,), (a.nan_to_num(neginf=-1e30),))         # -inf moved
    i = torch.tensor([3, 1, 2])
    assert autotune.agrees((i,), (i.clone(),)) and not autotune.agrees((i,), (i.flip(0),))
    h = torch.tensor([1.0, 256.0]).bfloat16()
    assert autotune.agrees((h,), (h + 1,)) and not autotune.agrees((h,), (h + 4,))  # 2**-7 * 256 = 2


def test_report_lists_kernel_configs(monkeypatch):
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    pick()
    text = str(inductor_dsa.report())
    assert "kernel configs:" in text and "select[" in text and "(tuned)" in text and "vs shipped" in text


def test_targets_named_by_arch(monkeypatch):
    props = lambda **kw: type("P", (), kw)()
    monkeypatch.setattr(torch.version, "hip", None)
    for cap, name in (((9, 0), "sm90"), ((8, 9), "sm89"), ((10, 0), "sm100")):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i, c=cap: props(major=c[0], minor=c[1]))
        assert configs.device_target.__wrapped__(0) == name
    monkeypatch.setattr(torch.version, "hip", "6.4")
    for arch, name in (("gfx942:sramecc+:xnack-", "gfx942"), ("gfx950", "gfx950")):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i, a=arch: props(gcnArchName=a))
        assert configs.device_target.__wrapped__(0) == name
    assert configs.for_target(configs.PAGED, "gfx950") is configs.PAGED[configs.OTHER]
    assert configs.for_target(configs.PAGED, "gfx942") is configs.PAGED["gfx942"]
    assert configs.candidates("paged", "sm100", configs.PAGED[configs.OTHER])[0] is configs.PAGED[configs.OTHER]


def test_aot_covers_every_candidate():
    from inductor_dsa.kernels import aot_variants, compile_key, config_variants
    for target in configs.TARGETS:
        names, keys = [], set()
        for name, _fn, *rest in aot_variants(target):
            names.append(name)
            keys.add(compile_key(name.split(" (")[0], *rest))
        assert len(names) == len(set(names))
        tuned = {f: set() for f in configs.CANDIDATES}
        for family, cfg, variants in config_variants(target):
            tuned[family].add(configs.describe(cfg) if cfg else "shipped")
            assert all(compile_key(v[0], *v[2:]) in keys for v in variants), (family, cfg)
        assert all(tuned[f] >= {configs.describe(c) for c in configs.CANDIDATES[f][target]} - {
            configs.describe(configs.logits_config(target, m)) for m in (False, True)} for f in tuned)


# --- real kernels: a tuned launch gives the shipped launch's results -------------------------------

def _tuned_vs_shipped(monkeypatch, call):
    autotune.autotune(False)
    shipped = call()
    autotune.autotune(True)
    monkeypatch.setattr(autotune, "timer", prefer_candidates)
    tuned = call()
    assert any(c.status == "tuned" and describe_differs(c) for c in autotune.used()), autotune.used()
    return shipped, tuned


def describe_differs(choice):
    return configs.describe(choice.config) not in SHIPPED


def test_tuned_logits_topk_and_indexer_topk(monkeypatch):
    g = torch.Generator().manual_seed(0)
    t, n, h, d, topk = 6, 96, 4, 32, 8
    q = torch.randn(t, h, d, generator=g).bfloat16().to(DEVICE)
    k = torch.randn(n, d, generator=g).bfloat16().to(DEVICE)
    w = torch.randn(t, h, generator=g).to(DEVICE)
    ke = torch.arange(n - t + 1, n + 1, dtype=torch.int32, device=DEVICE)
    ks = torch.zeros_like(ke)
    shipped, tuned = _tuned_vs_shipped(monkeypatch, lambda: inductor_dsa.indexer_topk(q, k, w, topk, k_start=ks,
                                                                                      k_end=ke))
    assert torch.equal(shipped[1], tuned[1]) and torch.allclose(shipped[0], tuned[0], rtol=1e-5, atol=1e-5)
    families = {c.family for c in autotune.used() if c.status == "tuned"}
    assert families == {"indexer_logits", "select"}


def test_tuned_paged_topk(monkeypatch):
    from paged_cases import make_case, run_paged_topk
    case = make_case(torch.Generator().manual_seed(1), max_pages=4, ctx=[0, 70, 200])
    shipped, tuned = _tuned_vs_shipped(monkeypatch, lambda: run_paged_topk(case, 16, "mxfp4", "fn"))
    assert torch.equal(shipped[1], tuned[1]) and torch.equal(shipped[0], tuned[0])


def test_tuned_sparse_attention(monkeypatch):
    from attention_cases import make
    q, kv, idx, sink = make(1, 2, 16, 32, 40, 48)
    shipped, tuned = _tuned_vs_shipped(monkeypatch, lambda: inductor_dsa.sparse_attention(
        q, kv, idx, sink=sink, return_lse=True))
    assert autotune.agrees(shipped, tuned)
