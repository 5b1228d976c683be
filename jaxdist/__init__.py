"""jaxdist: TensorFlow's `tf.distribute` API, reimplemented functionally on JAX."""

from jaxdist import cluster_resolver as cluster_resolver
from jaxdist import errors as errors
from jaxdist import experimental as experimental
from jaxdist import nn as nn
from jaxdist._base.devices import AXIS as AXIS
from jaxdist._base.options import InputOptions as InputOptions
from jaxdist._base.options import InputReplicationMode as InputReplicationMode
from jaxdist._base.options import RunOptions as RunOptions
from jaxdist._base.reduce_op import ReduceOp as ReduceOp
from jaxdist._collective.all_reduce import HierarchicalCopyAllReduce as HierarchicalCopyAllReduce
from jaxdist._collective.all_reduce import NcclAllReduce as NcclAllReduce
from jaxdist._collective.cross_device_ops import CrossDeviceOps as CrossDeviceOps
from jaxdist._collective.cross_device_ops import ReductionToOneDevice as ReductionToOneDevice
from jaxdist._collective.replica_context import ReplicaContext as ReplicaContext
from jaxdist._input.datasets import DistributedDataset as DistributedDataset
from jaxdist._input.datasets import DistributedIterator as DistributedIterator
from jaxdist._input.datasets import DistributedOptional as DistributedOptional
from jaxdist._input.datasets import InputContext as InputContext
from jaxdist._input.numpy_dataset import NumpyDataset as NumpyDataset
from jaxdist._input.spec import TensorSpec as TensorSpec
from jaxdist._run.function import Function as Function
from jaxdist._run.function import function as function
from jaxdist._strategy.compat import StrategyV1 as StrategyV1
from jaxdist._strategy.default import experimental_set_strategy as experimental_set_strategy
from jaxdist._strategy.default import get_cross_replica_context as get_cross_replica_context
from jaxdist._strategy.default import get_replica_context as get_replica_context
from jaxdist._strategy.default import get_strategy as get_strategy
from jaxdist._strategy.default import has_strategy as has_strategy
from jaxdist._strategy.default import in_cross_replica_context as in_cross_replica_context
from jaxdist._strategy.extended import StrategyExtended as StrategyExtended
from jaxdist._strategy.mirrored import MirroredStrategy as MirroredStrategy
from jaxdist._strategy.mirrored import OneDeviceStrategy as OneDeviceStrategy
from jaxdist._strategy.multi_worker import (
    MultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy,
)
from jaxdist._strategy.strategy import Strategy as Strategy
from jaxdist._values.values import DistributedValues as DistributedValues
from jaxdist._values.values import Mirrored as Mirrored
from jaxdist._values.values import PerReplica as PerReplica

__version__ = "0.1.0"

__all__ = [
    "AXIS",
    "CrossDeviceOps",
    "DistributedDataset",
    "DistributedIterator",
    "DistributedOptional",
    "DistributedValues",
    "Function",
    "HierarchicalCopyAllReduce",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "Mirrored",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "NcclAllReduce",
    "NumpyDataset",
    "OneDeviceStrategy",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "RunOptions",
    "Strategy",
    "StrategyV1",
    "StrategyExtended",
    "TensorSpec",
    "cluster_resolver",
    "errors",
    "experimental",
    "experimental_set_strategy",
    "function",
    "get_cross_replica_context",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
    "nn",
]
