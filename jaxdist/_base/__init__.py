"""The ground floor: what every other wing stands on, importing no other jaxdist module.

What jaxdist reads of JAX beyond its public API (`jax_internals`: one door, checked per JAX
version), argument checks (`validate`), TF's error classes (`errors`), a step's Python use of a
traced value told as the user's line and fix (`user_errors`), ``ReduceOp`` and the MEAN rule
(`reduce_op`), option records (`options`), the optional integrations a scope enters, imported by
name only when their library is in use (`integrations`), the mode state machine: one immutable
state in a ``ContextVar`` (`context`), XLA's CPU pool (`cpu_threads`), device strings and the
``Replicas`` topology (`devices`), the stacked-array layout helpers (`layout`) and the bound on
programs in flight (`inflight`).

May import: no other wing.
"""
