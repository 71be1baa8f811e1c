"""Recognisers for DSA subgraphs in decomposed aten graphs.

``algebra``: the index algebra (atoms, values); ``interp``: one handler per aten op (the
spellings); ``masks``: the sympy proof that a mask is a per-row range; ``indexer``: the
prefill indexer pattern (roles of q, k, weights, relu order, mask, top-k).
"""
