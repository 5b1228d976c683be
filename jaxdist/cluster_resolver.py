"""`jaxdist.cluster_resolver`: the names TF keeps under `tf.distribute.cluster_resolver`.

>>> import jaxdist as jd
>>> r = jd.cluster_resolver.SimpleClusterResolver(
...     jd.cluster_resolver.ClusterSpec({"worker": ["h0:2222", "h1:2222"]}),
...     task_type="worker", task_id=1)
>>> r.task_type, r.task_id, r.cluster_spec().num_tasks("worker")
('worker', 1, 2)
"""

from jaxdist._cluster.cluster_spec import ClusterSpec as ClusterSpec
from jaxdist._cluster.resolvers import ClusterResolver as ClusterResolver
from jaxdist._cluster.resolvers import SimpleClusterResolver as SimpleClusterResolver
from jaxdist._cluster.resolvers import TFConfigClusterResolver as TFConfigClusterResolver
from jaxdist._cluster.union_resolver import UnionClusterResolver as UnionClusterResolver
from jaxdist._cluster.union_resolver import UnionResolver as UnionResolver

__all__ = [
    "ClusterResolver",
    "ClusterSpec",
    "SimpleClusterResolver",
    "TFConfigClusterResolver",
    "UnionClusterResolver",
    "UnionResolver",
]
