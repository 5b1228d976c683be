"""All-reduce cross-device ops: `NcclAllReduce` and `HierarchicalCopyAllReduce`.

Both reduce with XLA collectives (`lax.psum` over the replica axis inside one
program; XLA uses NCCL on GPUs) on the stacked, sharded value, so the data never
leaves its devices. Unlike TF's `NcclAllReduce`, they also run on CPU devices, so
GPU code can be tested on simulated CPU devices. `batch_reduce` packs small
tensors: each pack is one concatenated buffer and one collective. Destinations
other than the value's own devices are reduced with a plain
`ReductionToOneDevice`, as in TF.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxdist._base.devices import AXIS, Replicas
from jaxdist._base.layout import is_tracer, shard_rows, stacked_devices
from jaxdist._base.reduce_op import ReduceOp, finish
from jaxdist._base.validate import check_int
from jaxdist._collective.cross_device_ops import CrossDeviceOps, ReductionToOneDevice, place
from jaxdist._program import compile as _compile
from jaxdist._values.layout import num_components, stack
from jaxdist._values.values import DistributedValues, Mirrored, from_stacked


def split_packs(sizes: list[int], num_packs: int, bytes_per_pack: int, itemsize: int) -> list:
    """Consecutive index groups: ``bytes_per_pack`` wins when set, else ``num_packs``."""
    if bytes_per_pack > 0:
        packs: list[list[int]] = []
        current: list[int] = []
        nbytes = 0
        for i, size in enumerate(sizes):
            if current and nbytes + size * itemsize > bytes_per_pack:
                packs.append(current)
                current, nbytes = [], 0
            current.append(i)
            nbytes += size * itemsize
        return packs + [current]
    if num_packs == 0:
        return [[i] for i in range(len(sizes))]
    per = math.ceil(len(sizes) / min(num_packs, len(sizes)))
    return [list(range(i, min(i + per, len(sizes)))) for i in range(0, len(sizes), per)]


def _packed_psum(op: ReduceOp, packs: tuple, num_replicas: int) -> Callable:
    """A replica function: concatenate each pack, one psum per pack, split back."""

    def fn(*xs: jax.Array) -> list:
        out: list = [None] * len(xs)
        for pack in packs:
            flat = jnp.concatenate([xs[i].reshape(-1) for i in pack])
            total, offset = lax.psum(flat, AXIS), 0
            for i in pack:
                piece = total[offset : offset + xs[i].size].reshape(xs[i].shape)
                out[i] = finish(op, piece, num_replicas)
                offset += xs[i].size
        return out

    return fn


class _AllReduceOps(CrossDeviceOps):
    def __init__(self, num_packs: int = 1) -> None:
        self.num_packs = check_int(num_packs, "num_packs", minimum=0)

    def _all_reduce(self, op: ReduceOp, stackeds: list, options: Any) -> list:
        """All-reduces same-device stacked arrays with one collective per pack."""
        replicas = Replicas.of(stacked_devices(stackeds[0]))
        bytes_per_pack = options.bytes_per_pack if options is not None else 0
        packs: list = []
        by_dtype: dict = {}
        for i, x in enumerate(stackeds):
            by_dtype.setdefault(x.dtype, []).append(i)
        for dtype, idx in by_dtype.items():
            sizes = [math.prod(stackeds[i].shape[1:]) for i in idx]
            groups = split_packs(sizes, max(self.num_packs, 1), bytes_per_pack, dtype.itemsize)
            packs.extend(tuple(idx[j] for j in g) for g in groups)
        key = ("all_reduce", op, tuple(packs), tuple((x.shape, x.dtype) for x in stackeds))
        body = _packed_psum(op, tuple(packs), replicas.num)
        program = _compile.collective(replicas, key, lambda: body)
        what = f"{type(self).__name__} all-reduce"
        return list(_compile.dispatch(program, replicas, *stackeds, what=what))

    def _reduce(self, op: ReduceOp, value: DistributedValues, devices: Any, options: Any) -> Any:
        return self._batch_reduce(op, [(value, devices)], options)[0]

    def _batch_reduce(self, op: ReduceOp, pairs: list, options: Any) -> list:
        results: list = [None] * len(pairs)
        groups: dict = {}
        for i, (value, devices) in enumerate(pairs):
            x = None if isinstance(devices, int) else stack(value)
            if x is None or is_tracer(x) or num_components(value) == 1:
                results[i] = ReductionToOneDevice()._reduce(op, value, devices, options)
            elif devices != stacked_devices(x) and x.is_fully_addressable:
                # TF: destinations other than the value's devices take ReductionToOneDevice.
                results[i] = ReductionToOneDevice()._reduce(op, value, devices, options)
            else:
                groups.setdefault(stacked_devices(x), []).append((i, x))
        for src, members in groups.items():
            reduced = self._all_reduce(op, [s for _, s in members], options)
            for (i, _), out in zip(members, reduced):
                dest = pairs[i][1]
                if dest == src:
                    results[i] = from_stacked(out, Mirrored)
                else:
                    results[i] = place(shard_rows(out)[0], dest)
        return results

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_packs={self.num_packs})"


class NcclAllReduce(_AllReduceOps):
    """All-reduce with XLA collectives (NCCL on GPU); works on CPU devices too.

    >>> import jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=jd.NcclAllReduce())
    >>> v = s.experimental_distribute_values_from_function(
    ...     lambda ctx: float(ctx.replica_id_in_sync_group + 1))
    >>> [float(x) for x in s.extended.reduce_to(jd.ReduceOp.SUM, v, v).values]
    [3.0, 3.0]

    Args:
        num_packs: how many packs `batch_reduce` splits its values into (0: one
            collective per value). ``bytes_per_pack`` in
            `experimental.CommunicationOptions` overrides it.
    """


class HierarchicalCopyAllReduce(_AllReduceOps):
    """All-reduce with XLA collectives; XLA picks the copy topology.

    TF's version copies along a fixed hierarchy of 8 GPUs; on JAX the same
    all-reduce is one `lax.psum`, and ``num_packs`` packs as in `NcclAllReduce`.

    >>> import jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"],
    ...                         cross_device_ops=jd.HierarchicalCopyAllReduce(num_packs=2))
    >>> v = s.experimental_distribute_values_from_function(lambda ctx: 1.0)
    >>> [float(x) for x in s.extended.batch_reduce_to("MEAN", [(v, v), (v, v)])[1].values]
    [1.0, 1.0]

    Args:
        num_packs: how many packs `batch_reduce` splits its values into.
    """


def check_cross_device_ops(cdo: Any) -> CrossDeviceOps:
    """``cdo`` (None: `NcclAllReduce()`), or a clear `TypeError`."""
    if cdo is None:
        return NcclAllReduce()
    if isinstance(cdo, type) and issubclass(cdo, CrossDeviceOps):
        raise TypeError(
            f"cross_device_ops must be an instance, e.g. {cdo.__name__}(); got the class "
            f"{cdo.__name__}."
        )
    if not isinstance(cdo, CrossDeviceOps):
        raise TypeError(
            "cross_device_ops must be a jaxdist CrossDeviceOps instance (ReductionToOneDevice(), "
            f"NcclAllReduce(), HierarchicalCopyAllReduce()); got {type(cdo).__name__}."
        )
    return cdo
