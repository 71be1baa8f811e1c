"""Autotuning: per shape bucket, the fastest of a few AOT-checked configs, timed on the user's GPU.

Off unless asked for (``enabled``): ``inductor_dsa.autotune(True)``, ``INDUCTOR_DSA_AUTOTUNE=1``,
or a graph compiled by our backend with ``mode="max-autotune"`` (``INDUCTOR_DSA_AUTOTUNE=0`` or
``autotune(False)`` keeps it off even then). Off, every launch uses the shipped config (configs.py).

On, a launcher's first call in a shape bucket (the dims that change per step rounded up to a power
of two, plus the fixed ones) runs the shipped config, then each of the family's candidates
(``configs.CANDIDATES``) on the same inputs. A candidate that fails to compile or launch, or whose
result differs from the shipped one (``agrees``), is rejected; the fastest of the rest wins (ties:
the earlier, so the shipped config first). Winners live in memory and in one JSON file per bucket
under Inductor's cache dir (``cache_dir()``), stamped with device name, arch, Triton version and
the hash of the kernel sources; an entry that does not parse, whose stamps differ, or whose config is
not in the current candidate set is ignored (debug log), never trusted. Writes are atomic. While a
CUDA graph is being captured nothing is tuned: the cached winner, else the shipped config, runs.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field

import torch
import triton

from . import configs

log = logging.getLogger("inductor_dsa.autotune")

_switch: bool | None = None  # autotune(True / False); None: the env var, else max-autotune
_max_autotune = False        # a graph was compiled by our backend with mode="max-autotune"
_lock = threading.Lock()
_winners: dict = {}          # (family, target, key) -> config, this process
_used: dict = {}             # (family, target, key) -> Choice, for report()


def autotune(enable: bool | None = True) -> None:
    """Turn tuning on (True) or off (False); None: back to ``INDUCTOR_DSA_AUTOTUNE`` / max-autotune."""
    global _switch
    _switch = enable


def request_max_autotune() -> None:
    """Called by the backend when a graph is compiled with ``mode="max-autotune"``."""
    global _max_autotune
    _max_autotune = True


def enabled() -> bool:
    if _switch is not None:
        return _switch
    env = os.environ.get("INDUCTOR_DSA_AUTOTUNE", "")
    return env not in ("0", "false", "False") if env else _max_autotune


def bench(fn) -> float:
    """Milliseconds per call of ``fn`` on a GPU: the median of CUDA-graph replays
    (``triton.testing.do_bench_cudagraph``), so the host cost of a launch -- the same for every
    candidate -- cannot hide which kernel is faster; ``do_bench`` (eager launches) where the call
    cannot be captured. Under the interpreter one wall-clock call (not a measurement, but it runs)."""
    if torch.cuda.is_available() and not configs.interpreting():
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median")
        except RuntimeError:
            torch.cuda.synchronize()
            return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


MARGIN = 0.02  # a candidate replaces the shipped config only when at least 2% faster (replay noise ~0.5%)
timer = bench  # injectable (tests): timer(fn) -> milliseconds; fn is functools.partial(run, config)


@dataclass
class Choice:
    family: str
    target: str
    key: tuple
    shipped: object
    config: object
    status: str                                # shipped (autotune off) | tuned | cached | shipped (capturing)
    times: dict = field(default_factory=dict)  # candidate (its difference from the shipped config) -> ms
    rejected: dict = field(default_factory=dict)  # candidate -> why

    @property
    def winner(self) -> str:
        return configs.describe(self.config, self.shipped)

    def __str__(self):
        s = f"{self.family}[{self.target}] {self.key}: {self.winner} ({self.status})"
        if self.status == "tuned" and "shipped" in self.times:
            s += f", {min(self.times.values()):.4g} ms vs shipped {self.times['shipped']:.4g} ms"
        return s + "".join(f"\n    rejected {c}: {why}" for c, why in self.rejected.items())


def used() -> list:
    """What each tuned family ran with, per shape bucket (``inductor_dsa.report()`` lists it)."""
    with _lock:
        return list(_used.values())


def clear() -> None:
    """Forget this process's winners and records (the disk cache stays)."""
    with _lock:
        _winners.clear()
        _used.clear()


def cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir
    return os.path.join(inductor_cache_dir(), "inductor_dsa", "autotune")


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """Hash of every kernel module's source (kernels/*.py, configs included)."""
    h = hashlib.sha256()
    here = os.path.dirname(__file__)
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name(device: torch.device) -> str:
    if device.type == "cpu":
        return "triton-interpreter"
    return _device_name(device.index if device.index is not None else torch.cuda.current_device())


def agrees(ref, out) -> bool:
    """Same result: integer tensors (top-k indices) identical; float tensors NaN / inf at the same
    places and elsewhere within ``tol * max|ref|``, tol 1e-4 for fp32, 2**-7 for bf16 / fp16."""
    for r, o in zip(ref, out):
        if r.shape != o.shape or r.dtype != o.dtype:
            return False
        if not r.is_floating_point():
            if not torch.equal(r, o):
                return False
            continue
        tol = 1e-4 if r.dtype == torch.float32 else 2.0 ** -7
        r, o = r.float(), o.float()
        fin = torch.isfinite(r)
        if not (torch.equal(fin, torch.isfinite(o)) and torch.equal(r[~fin].nan_to_num(), o[~fin].nan_to_num())):
            return False
        if fin.any() and ((r[fin] - o[fin]).abs() > tol * r[fin].abs().max()).any():
            return False
    return True


def pick(family: str, target: str, device: torch.device, default, key: tuple, run):
    """The config to launch ``family`` with: ``default`` (the shipped one) unless tuning is on, else
    this bucket's winner, from memory, disk, or tuned now by timing ``run(config)`` (which returns
    the launch's output tensors) for each candidate."""
    if not enabled():
        return shipped(family, target, default)
    full = (family, target, key)
    cfg = _winners.get(full)
    if cfg is not None:
        return cfg
    cands = configs.candidates(family, target, default)
    choice = _load(family, target, device, key, cands)
    if choice is None and capturing():
        _record(Choice(family, target, key, default, default, "shipped (capturing, not tuned)"), full)
        return default  # not remembered: the first call outside capture tunes
    if choice is None:
        choice = _tune(family, target, key, cands, run)
        _store(device, choice)
    with _lock:
        _winners[full] = choice.config
    _record(choice, full)
    return choice.config


def shipped(family: str, target: str, default):
    """``default``, recorded as ``family``'s choice on ``target`` with tuning off (``pick`` when
    ``enabled()`` is false; launchers that checked ``enabled()`` themselves call it directly)."""
    if (family, target) not in _used:
        _record(Choice(family, target, (), default, default, "shipped (autotune off)"), (family, target))
    return default


def _record(choice: Choice, slot) -> None:
    with _lock:
        _used[slot] = choice


def _tune(family, target, key, cands, run) -> Choice:
    default = cands[0]
    choice = Choice(family, target, key, default, default, "tuned")
    ref = run(default)
    timed = []
    for cfg in cands:
        name = configs.describe(cfg, default)
        try:
            if cfg is not default and not agrees(ref, run(cfg)):
                choice.rejected[name] = "result differs from the shipped config's"
                continue
            ms = timer(functools.partial(run, cfg)) if len(cands) > 1 else 0.0
        except Exception as e:  # noqa: BLE001 - a candidate that cannot compile or launch here
            if cfg is default:
                raise
            choice.rejected[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            continue
        choice.times[name] = ms
        timed.append((ms, cfg))
    best_ms, best = min(timed, key=lambda t: t[0])  # min keeps the first of equal times
    if best is not default and best_ms > (1 - MARGIN) * timed[0][0]:
        best = default  # within the timer's noise of the shipped config: no reason to change it
    choice.config = best
    log.info("autotuned %s", choice)
    return choice


def _path(family, target, device, key) -> str:
    h = hashlib.sha256(repr((device_name(device), target, key)).encode()).hexdigest()[:24]
    return os.path.join(cache_dir(), f"{family}-{h}.json")


def _stamp(family, target, device, key) -> dict:
    return dict(family=family, target=target, device=device_name(device), key=repr(key),
                triton=triton.__version__, source=source_hash())


def _load(family, target, device, key, cands):
    """This bucket's winner from disk, or None (absent, corrupt, stale, or not a current candidate)."""
    path = _path(family, target, device, key)
    try:
        with open(path) as f:
            entry = json.load(f)
        stamp = _stamp(family, target, device, key)
        stale = [k for k, v in stamp.items() if entry.get(k) != v]
        if stale:
            log.debug("autotune cache %s ignored: stale %s", path, ", ".join(stale))
            return None
        for cfg in cands:
            if dataclasses.asdict(cfg) == entry["config"]:
                return Choice(family, target, key, cands[0], cfg, "cached", times=dict(entry.get("times", {})))
        log.debug("autotune cache %s ignored: its config is not a current candidate", path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        log.debug("autotune cache %s ignored: %s", path, e)
    return None


def _store(device, choice: Choice) -> None:
    """Write the winner atomically (temp file + os.replace); a failure only costs the next process a retune."""
    path = _path(choice.family, choice.target, device, choice.key)
    entry = dict(_stamp(choice.family, choice.target, device, choice.key),
                 config=dataclasses.asdict(choice.config), times=choice.times)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), suffix=".tmp", delete=False) as f:
            json.dump(entry, f)
        os.replace(f.name, path)
    except OSError as e:
        log.debug("autotune cache %s not written: %s", path, e)


def bucket(n: int) -> int:
    """A shape bucket: n rounded up to a power of two (0 stays 0)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
