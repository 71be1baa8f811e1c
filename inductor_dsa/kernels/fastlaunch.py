"""Planned Triton launches: ``kernel[grid](...)`` once per launch plan, then its compiled kernel directly.

``JITFunction.run`` re-derives, on every call, what the compiled kernel depends on (argument
types, 16-byte alignment of pointers and ints, ints equal to 1, constexprs, options) and hashes
it into a cache key: 12 us (2 args) to 26 us (30 args) of host time per launch on the H200's
host, most of a batch-1 decode call (docs/design.md "Host overhead"). A launcher whose plan is
cached by a key that already fixes all of that (the inputs' shapes, strides, dtypes, pointer
alignments and device: every int argument and constexpr is derived from them, and fresh
workspaces come 512-byte aligned from the caching allocator) holds a ``Launch`` per kernel call
of the plan: the first call goes through Triton and keeps the compiled kernel it returns, later
calls invoke that kernel's launcher with the same positional arguments Triton passes
(``CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata, metadata, enter, exit, *args)``,
triton 3.4-3.7). Same kernel, same arguments, same stream: results are unchanged and the launch
stays CUDA-graph capturable. Under the interpreter, with a launch hook installed (profilers), with
``INDUCTOR_DSA_FAST_LAUNCH=0``, on ROCm, or with a Triton outside ``VERIFIED_TRITON``, every call
is ``kernel[grid](...)``.
"""
from __future__ import annotations

import os

import torch
import triton
from triton import knobs
from triton.runtime.driver import driver

from . import configs

FAST_ENV = "INDUCTOR_DSA_FAST_LAUNCH"


# where the direct call's argument order was checked: run on the H200 (CUDA, triton 3.6) and read
# in triton 3.7's source; other Tritons and ROCm (not run anywhere) keep kernel[grid]
VERIFIED_TRITON = ("3.6.", "3.7.")


def _fast_allowed() -> bool:
    return (not configs.interpreting() and os.environ.get(FAST_ENV, "1") != "0" and torch.version.hip is None
            and triton.__version__.startswith(VERIFIED_TRITON))


def _hooked() -> bool:
    """A launch hook is installed (None, or an empty HookChain, when not): such calls go through Triton."""
    return any(h is not None and bool(getattr(h, "calls", True))
               for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


class Arg:
    """Placeholder of a per-call tensor in ``Launch(...)``: ``env[name]`` at call time."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class Launch:
    """``fn[grid](*args, **options)`` with ``args`` (every parameter of fn by name, constexprs
    included) fixed except the ``Arg`` placeholders, filled per call from ``env``."""
    __slots__ = ("fn", "grid", "args", "slots", "options", "compiled")

    def __init__(self, fn, grid, options: dict, **args):
        names = fn.arg_names
        missing = set(names) ^ set(args)
        if missing:
            raise TypeError(f"{fn.__name__}: arguments {sorted(missing)} missing or unknown")
        self.fn, self.options, self.compiled = fn, options, None
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.args = [args[a] for a in names]
        self.slots = tuple((i, v.name) for i, v in enumerate(self.args) if isinstance(v, Arg))

    def _filled(self, env: dict) -> list:
        a = self.args.copy()
        for i, name in self.slots:
            a[i] = env[name]
        return a

    def __call__(self, env: dict) -> None:
        run((self,), env)


def current_stream() -> int:
    """The current device's current stream, as Triton's launcher takes it."""
    drv = driver.active
    return drv.get_current_stream(drv.get_current_device())


def region(env: dict, name: str, base: str, at: int, size: int, dtype) -> torch.Tensor:
    """Words [at, at + size) of env[base] viewed as dtype: a ``run`` region as a tensor."""
    return env[base].view(dtype).narrow(0, at, size)


def run(launches, env: dict, regions=()) -> None:
    """Each launch in order with the tensors of ``env`` (name -> tensor). ``regions``: (name, base,
    word offset, words, dtype) entries, env[name] = words [offset, offset + words) of env[base]
    viewed as dtype (4-byte words). Once every launch holds its compiled kernel (and no launch
    hook is installed), pointers go to the launcher as ints: no views are built, and the
    launcher skips its per-argument ``data_ptr()`` call and driver pointer query."""
    if all(launch.compiled is not None for launch in launches) and not _hooked():
        ptr = {name: t.data_ptr() for name, t in env.items()}
        for name, base, at, _, _ in regions:
            ptr[name] = ptr[base] + 4 * at
        stream = current_stream()
        for launch in launches:
            k = launch.compiled
            k.run(*launch.grid, stream, k.function, k.packed_metadata, None, None, None, *launch._filled(ptr))
        return
    for r in regions:
        env[r[0]] = region(env, *r)
    for launch in launches:
        k = launch.fn[launch.grid](*launch._filled(env), **launch.options)
        if k is not None and _fast_allowed() and hasattr(k, "packed_metadata"):
            launch.compiled = k
