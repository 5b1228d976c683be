"""The replicas' program: compiled, cached and dispatched.

The one ``jax.pmap`` caller and the compile cache, weak on the user's function (`compile`),
one replica's program (``jax.jit`` over a ``vmap`` of size one: no replica axis, no collective)
and the plans its repeated calls replay (`one_replica`), and what a compiled step re-reads of
its state, ``jd.experimental.explain`` and ``step_count`` (`explain`).

May import: `_base`, `_values`, `_state` (a step is traced with its state as inputs).
"""
