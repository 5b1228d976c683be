"""Several workers: TF's cluster resolvers and ``jax.distributed``.

`ClusterSpec` (`cluster_spec`), TF's cluster resolvers (`resolvers`, `union_resolver`),
``TF_CONFIG`` read into a cluster (`config`), joining it through ``jax.distributed`` (`join`),
the guard that ends every worker on a fault (`guard`), and the host's malloc tuning (`host`).

May import: `_base`.
"""
