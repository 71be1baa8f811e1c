"""The symbolic engine: reads FX graphs into index algebra and proves facts about it.

It knows nothing about DSA. The recognisers in ``patterns/`` are built on it.

* ``shapes``: sympy sizes, decided with the graph's ShapeEnv; ``Reject``;
* ``atoms``: index variables (union-find with refinement), ``atom_symbol`` / ``atom_of``;
* ``values``: what a tensor computes (value trees), ``deps``, ``run_prog``, ``substitute``;
* ``reader``: ``Interpreter`` (reads nodes on demand with one ``HandlerSet``), ``TV``;
* handler families: ``read_layout.LAYOUT``, ``read_arith.ARITH``, ``read_gather.GATHER``,
  ``read_bytes.BYTES`` (composed with ``HandlerSet.chain``);
* ``ranges``: proofs that a mask is a per-row range of columns;
* ``emit``: sympy -> torch while a replacement is traced.
"""
from .atoms import Atoms, atom_of, atom_symbol
from .read_arith import ARITH
from .read_bytes import BYTES, as_elem, constant_tensor
from .read_gather import GATHER
from .read_layout import LAYOUT
from .reader import TV, HandlerSet, Interpreter, packet, shape_env_of
from .shapes import Reject, Shapes, as_expr
from .values import (Add, AllReduce, Cast, Cat, Const, Contract, Elem, Exp, Gather, Index, Leaf, Max, Maximum,
                     Mul, Recip, Relu, Slice, Sum, Value, Where, const_value, deps, run_prog, substitute)

__all__ = [
    "ARITH", "Add", "AllReduce", "Atoms", "BYTES", "Cast", "Cat", "Const", "Contract", "Elem", "Exp", "GATHER",
    "Gather", "HandlerSet", "Index", "Interpreter", "LAYOUT", "Leaf", "Max", "Maximum", "Mul", "Recip", "Reject",
    "Relu", "Shapes", "Slice", "Sum", "TV", "Value", "Where", "as_elem", "as_expr", "atom_of", "atom_symbol",
    "const_value", "constant_tensor", "deps", "packet", "run_prog", "shape_env_of", "substitute",
]
