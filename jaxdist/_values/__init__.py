"""Distributed values: TF's ``PerReplica`` and ``Mirrored`` as JAX pytrees.

The classes, their pytree registration and constructors (`values`), the fields of their layout
made and read (`layout`: with `values` the only modules that read them), and whole structures
of them with the ``ValueContext`` of ``experimental_distribute_values_from_function`` (`trees`).

May import: `_base`.
"""
