"""The data-parallel ``train_function`` / ``test_function`` / ``predict_function`` of a Keras
model built in a strategy's scope, TF's way (see `jaxdist._keras`).

Each step is one `jax.jit` program around ``strategy.run``: every replica runs
Keras' own stateless methods on its slice of the global batch (split as TF
splits it by ``strategy.experimental_distribute_dataset``, partial batches
included), and the replicas' results are combined as ``tf.distribute`` combines
a Keras model's under ``MirroredStrategy``:

* loss: each replica's loss (the mean over its own slice) is scaled by
  ``1 / num_replicas_in_sync`` (Keras' ``scale_loss_for_distribution`` on the TF
  backend), and the gradients are all-reduced with SUM before the optimizer
  applies them, identically on every replica;
* metrics (the loss tracker included) count every example: each replica updates
  Keras' metric state with its slice and the updates are summed (TF's metric
  variables are SUM-aggregated on read);
* non-trainable variables follow their ``aggregation``: ``"none"`` (batch-norm
  moving statistics, seed states) is kept per replica, as TF's mirrored variables
  are updated by each replica on its own device; the Keras variable holds replica
  0's copy (TF's primary), and the other copies are kept here while the variable
  still holds the value this step gave it (an assignment from outside sets every
  copy again); ``"mean"``/``"sum"`` are all-reduced; ``"only_first_replica"``
  takes replica 0's.

A replica that the split leaves with no rows (a partial batch, ``ceil(b / R)`` rows
each) contributes nothing: the rule of `is_empty`, its loss reduced by the custom
loops' `jaxdist._nn.div_no_nan`.

One all-reduce per step carries gradients, metric updates and aggregated
variables. The program is traced once per input signature (a full batch and a
partial batch are two; ``steps_per_execution`` full batches in one program a
third); `traces` counts it. Batches of NumPy arrays that split evenly go to the
program as they are, and ``steps_per_execution=k`` full batches run as one
program (`jaxdist._keras_fused`); other batches are split by the strategy's
`Placer`, and whole batches (``*_on_batch``) or several processes take the
placed path (`StepFunction._placed_steps`). Its dispatches stay under the
in-flight bound (`jaxdist._inflight`). With several workers, jaxdist traces no
partial batch inside `jax.jit`: that step runs eagerly through ``strategy.run``
(`StepFunction._eager`), on each worker's copy of the state.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from jaxdist import _inflight
from jaxdist._compile import rows_as_replicated
from jaxdist._default import get_replica_context
from jaxdist._input_place import Placer
from jaxdist._keras_fused import host_split, same_shapes, scan_steps
from jaxdist._nn import div_no_nan
from jaxdist._options import InputOptions
from jaxdist._reduce_op import ReduceOp
from jaxdist._values import from_stacked, is_distributed, stacked

_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> (the primaries of its per-replica variables, as last returned; all replicas' copies)."""

_WHOLE_BATCH: contextvars.ContextVar[bool] = contextvars.ContextVar("keras_whole", default=False)

_NO_READ_AHEAD = InputOptions(experimental_per_replica_buffer_size=0)


@contextlib.contextmanager
def whole_batch() -> Iterator[None]:
    """``train_on_batch`` & co.: every replica gets the whole batch, as TF's Keras trainer
    passes the batch to ``strategy.run`` undistributed (so the loss scaled by ``1 / replicas``
    and summed gives the batch's mean, and batch norm sees the whole batch)."""
    token = _WHOLE_BATCH.set(True)
    try:
        yield
    finally:
        _WHOLE_BATCH.reset(token)


def is_for(fn: Any, strategy: Any) -> bool:
    """Whether ``fn`` is a step function of this module built for ``strategy``."""
    return isinstance(fn, StepFunction) and fn.strategy is strategy


def make_function(model: Any, strategy: Any, kind: str) -> StepFunction:
    """``model.<kind>_function`` for a model of ``strategy`` (kind: train, test, predict)."""
    _check_overrides(model, kind)
    return StepFunction(model, strategy, kind)


def _check_overrides(model: Any, kind: str) -> None:
    name = f"{kind}_step"
    if getattr(type(model), name) is not getattr(keras.Model, name):
        raise NotImplementedError(
            f"{type(model).__name__} overrides {name}; under a jaxdist strategy model.fit/"
            "evaluate/predict run Keras' own steps per replica. Write the loop yourself "
            "(docs/guides/keras.md: custom training loops with stateless_call and strategy.run)."
        )


class StepFunction:
    """``(state, iterator) -> (outputs, state)``, Keras' JAX step-function protocol.

    >>> import numpy as np, keras, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> with s.scope():
    ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    ...     model.compile(optimizer="sgd", loss="mse")
    >>> _ = model.fit(np.ones((10, 3)), np.ones((10, 1)), batch_size=4, verbose=0)
    >>> model.train_function.traces  # compiled twice: batches of 4, and the last one of 2
    2
    """

    def __init__(self, model: Any, strategy: Any, kind: str) -> None:
        self.model_ref = weakref.ref(model)
        self.strategy = strategy
        self.kind = kind
        self.traces = 0
        self.layout = _Layout(model, strategy)
        self._source: Any = None
        self._returned: Any = None
        self._batches: Any = None
        self._jitted = jax.jit(self._program, static_argnums=3, donate_argnums=(0, 1))
        replicas = strategy.extended.replicas
        self._replicas = replicas
        self._n = replicas.num
        self._device = replicas.devices[0]
        self._placer = Placer(replicas, True)
        self._host_ok = not replicas.multi_process
        rows = replicas.sharding if self._n > 1 else None
        self._fast = jax.jit(
            self._fast_program, donate_argnums=(0, 1), in_shardings=(None, None, rows)
        )

    def model(self) -> Any:
        model = self.model_ref()
        if model is None:
            raise ReferenceError(f"the Keras model of this {self.kind}_function was deleted")
        return model

    def __call__(self, state: Any, iterator: Any) -> tuple[Any, Any]:
        k = max(1, int(self.model().steps_per_execution))
        if _WHOLE_BATCH.get() or not self._host_ok:
            with self.strategy.scope():
                return self._placed_steps(state, iterator, k)
        batches = []
        for i in range(k):
            try:
                batches.append(next(iterator))
            except StopIteration:
                if i == 0:
                    raise
                break
        split = [host_split(b, self._n, self._device) for b in batches]
        raw = [x[0] for x in split if x is not None]
        if k > 1 and len(raw) == k and same_shapes(raw):  # k steps, one program
            out, state = self._run_fast(state, tuple(raw))
            return out, state
        outputs = []
        for batch, x in zip(batches, split):
            if x is not None:
                out, state = self._run_fast(state, (x[0],))
            else:  # a partial batch (or leaves the host split does not take): the strategy's
                out, state = self._one(state, self._placer.split(batch, "the Keras batch"))
            outputs.append(out)
        return self._last(outputs), state

    def _placed_steps(self, state: Any, iterator: Any, k: int) -> tuple[Any, Any]:
        """Steps on batches the strategy places (whole batches; several processes)."""
        outputs = []
        for i in range(k):
            try:
                batch = self._next(iterator)
            except StopIteration:
                if i == 0:
                    raise
                break
            out, state = self._one(state, batch)
            outputs.append(out)
        return self._last(outputs), state

    def _last(self, outputs: list) -> Any:
        if self.kind == "predict":
            if len(outputs) == 1:
                return outputs[0]
            return jax.tree.map(lambda *xs: jnp.concatenate(xs), *outputs)
        return outputs[-1]

    def _next(self, iterator: Any) -> Any:
        if _WHOLE_BATCH.get():  # replicated: every replica reads the whole batch
            return jax.device_put(next(iterator), self.layout.sharding)
        source = None if self._source is None else self._source()
        if source is not iterator:
            ds = self.strategy.experimental_distribute_dataset(iterator, options=_NO_READ_AHEAD)
            self._batches = iter(ds)
            self._source = weakref.ref(iterator)
        return next(self._batches)

    def _one(self, state: Any, batch: Any) -> tuple[Any, Any]:
        state = self._own(state)
        copies = self._copies_for(state)
        args = (state, copies, batch, _WHOLE_BATCH.get())
        try:
            outputs, state, copies, marker = self._jitted(*args)
        except NotImplementedError:  # raised while tracing, before anything ran or was donated
            if not self.strategy.extended.replicas.multi_process:
                raise
            outputs, state, copies, _ = self._eager(*args)  # a partial batch across workers
        else:
            _inflight.throttle(marker, f"model.{self.kind}")
        return outputs, self._keep(state, copies)

    def _run_fast(self, state: Any, batches: tuple) -> tuple[Any, Any]:
        """Steps on host batches split by `host_split` (one or ``steps_per_execution``)."""
        state = self._own(state)
        outputs, state, copies, marker = self._fast(state, self._copies_for(state), batches)
        if self._n > 1:  # one device: no collective to bound
            _inflight.throttle(marker, f"model.{self.kind}")
        return outputs, self._keep(state, copies)

    def _own(self, state: Any) -> Any:
        if state is not self._returned:  # Keras' variables: some may have been built outside
            state = jax.device_put(tuple(list(s) for s in state), self.layout.sharding)
        return state

    def _keep(self, state: Any, copies: tuple) -> Any:
        if self.layout.own:
            _COPIES[self.model()] = (tuple(state[1][i] for i in self.layout.own), copies)
        self._returned = state
        return state

    def _copies_for(self, state: Any) -> tuple:
        own = self.layout.own
        primaries, copies = _COPIES.get(self.model(), ((), ()))
        if len(primaries) == len(own) and all(state[1][i] is p for i, p in zip(own, primaries)):
            return copies
        n = self.strategy.num_replicas_in_sync
        return tuple(jnp.broadcast_to(state[1][i], (n, *state[1][i].shape)) for i in own)

    def _program(self, state: Any, copies: tuple, batch: Any, whole: bool) -> tuple:
        self.traces += 1
        out = self.strategy.run(self._replica, args=(state, copies, batch))
        return (*self._combine(out, whole, self.layout.place), jnp.zeros(()))

    def _fast_program(self, state: Any, copies: tuple, batches: tuple) -> tuple:
        """``len(batches)`` steps on `host_split` batches, one program (`scan_steps`)."""
        self.traces += 1
        with self.strategy.scope():
            concat, unroll = self.kind == "predict", self._device.platform == "cpu"
            out = scan_steps(self._step, state, copies, batches, concat, unroll)
        return (*out, jnp.zeros(()))

    def _step(self, state: Any, copies: tuple, raw: Any) -> tuple:
        batch = raw if self._n == 1 else jax.tree.map(from_stacked, raw)
        out = self.strategy.run(self._replica, args=(state, copies, batch))
        outputs, state, copies = self._combine(out, False, self.layout.place)
        return outputs, tuple(list(s) for s in state), copies

    def _eager(self, state: Any, copies: tuple, batch: Any, whole: bool) -> tuple:
        """The step outside jax.jit, on this worker's copy of the state: a partial batch
        across workers, which jaxdist traces only eagerly (docs/guides/guarantees.md, Limits)."""
        local = (jax.tree.map(np.asarray, state), jax.tree.map(np.asarray, copies))
        out = self.strategy.run(self._replica, args=(*local, batch))

        def place(tree: Any) -> Any:  # the same value on every worker: a global array
            return jax.device_put(tree, self.layout.sharding)

        return (*self._combine(out, whole, place), None)

    def _combine(self, out: tuple, whole: bool, place: Callable) -> tuple:
        """Outputs, Keras' state (replica 0's, mirrored) and every replica's own copies."""
        s = self.strategy
        outputs, state, copies = out
        first = s.experimental_local_results
        if self.kind == "predict" and not whole:
            outputs = s.gather(outputs, axis=0)
        else:
            outputs = first(outputs)[0]
        copies = tuple(s.gather(c, axis=0) for c in copies)
        state = self._same_everywhere(state, list(first(state)[0]))
        state[1] = list(state[1])
        for k, i in enumerate(self.layout.own):  # replica 0's copy (TF's primary)
            state[1][i] = copies[k][0]
        return outputs, place(tuple(state)), place(copies)

    def _same_everywhere(self, out: Any, state: list) -> list:
        """``state`` (replica 0's) with the variables that are one value on every replica
        (trainable, optimizer and metric variables; all-reduced non-trainable ones) kept
        where each replica computed them (`rows_as_replicated`): no copy of the model
        from replica 0 to the others on every step."""
        if self._n == 1:
            return state
        same = [
            (p, i)
            for p, part in enumerate(out)
            for i, v in enumerate(part)
            if (p != 1 or i in self.layout.mean + self.layout.sum) and is_distributed(v)
        ]
        rows = rows_as_replicated([stacked(out[p][i]) for p, i in same], self._replicas)
        state = [list(part) for part in state]
        for (p, i), v in zip(same, rows):
            state[p][i] = v
        return state

    def _replica(self, state: Any, copies: tuple, data: Any) -> tuple:
        ctx = get_replica_context()
        model = self.model()
        state = self.layout.with_copies(state, copies, ctx)
        x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
        if self.kind == "predict":
            y_pred, ntv = model.predict_step(state, data)
            return y_pred, (state[0], ntv), self.layout.own_copies(ntv)
        if self.kind == "train":
            return _train(model, ctx, self.layout, state, x, y, sw)
        return _test(model, ctx, self.layout, state, x, y, sw)


def _train(model: Any, ctx: Any, layout: _Layout, state: Any, x: Any, y: Any, sw: Any) -> tuple:
    tv, ntv, ov, mv = state
    n = ctx.num_replicas_in_sync

    def loss_fn(tv: Any) -> tuple:
        loss, (unscaled, *aux) = model.compute_loss_and_updates(
            tv, ntv, mv, x, y, sw, training=True, optimizer_variables=ov
        )
        loss, unscaled = replica_loss(loss), replica_loss(unscaled)
        return loss / n, (unscaled, *aux)  # TF: each replica's loss scaled by 1 / replicas

    (_, (unscaled, y_pred, new_ntv, new_mv)), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv)
    # Private Keras API: the metric update of Keras' own JAX train_step.
    _, new_mv = model._update_metrics_variables(new_mv, unscaled, x, y, y_pred, sw)
    if is_empty(x):  # it still ran Keras' step: a synchronized layer's collectives need it
        grads, new_mv = jax.tree.map(jnp.zeros_like, grads), mv
        new_ntv = kept_where_undefined(ntv, new_ntv)
    grads, new_mv, new_ntv = layout.combine(ctx, mv, new_mv, new_ntv, grads)
    tv, ov = model.optimizer.stateless_apply(ov, grads, tv)
    logs = metrics_result(model, new_mv)
    return logs, (tv, new_ntv, ov, new_mv), layout.own_copies(new_ntv)


def _test(model: Any, ctx: Any, layout: _Layout, state: Any, x: Any, y: Any, sw: Any) -> tuple:
    tv, ntv, mv = state
    _, (unscaled, y_pred, new_ntv, new_mv) = model.compute_loss_and_updates(
        tv, ntv, mv, x, y, sw, training=False
    )
    unscaled = replica_loss(unscaled)
    # Private Keras API: the metric update of Keras' own JAX test_step.
    _, new_mv = model._update_metrics_variables(new_mv, unscaled, x, y, y_pred, sw)
    if is_empty(x):
        new_mv, new_ntv = mv, kept_where_undefined(ntv, new_ntv)
    _, new_mv, new_ntv = layout.combine(ctx, mv, new_mv, new_ntv, None)
    return metrics_result(model, new_mv), (tv, new_ntv, new_mv), layout.own_copies(new_ntv)


def is_empty(x: Any) -> bool:
    """Whether this replica has no rows (static: each replica's shape is traced).

    An empty replica (``tf.distribute`` splits a partial batch into ``ceil(b / R)`` rows
    per replica, the last ones possibly 0) contributes nothing: its loss is 0
    (`replica_loss`), its gradient is 0 and its metric updates are none. Keras' own step
    still runs on it with 0 rows, as every replica must join a synchronized layer's
    all-reduce, and its non-trainable variables take what that step computed (a
    synchronized batch norm's global statistics, a seed's advance, as in TF) except
    where it divided 0 by 0 (`kept_where_undefined`): so it never turns into NaN.

    >>> import numpy as np
    >>> is_empty(np.zeros((0, 3))), is_empty((np.zeros((2, 3)),))
    (True, False)
    """
    leaves = jax.tree.leaves(x)
    return bool(leaves) and int(np.shape(leaves[0])[0]) == 0


def kept_where_undefined(old: Any, new: Any) -> Any:
    """An empty replica's non-trainable variables: ``new`` where finite, else ``old``.

    A per-replica batch norm on no rows takes the moments of nothing (0 / 0): TF's moving
    statistics of that replica turn NaN, and later every prediction it makes; here they
    stay as they were. Values its step computed from other replicas (synchronized
    moments) or without rows (a seed's advance) are kept.

    >>> import jax.numpy as jnp
    >>> [float(v) for v in kept_where_undefined([jnp.array(1.0)], [jnp.array(jnp.nan)])]
    [1.0]
    """

    def keep(o: Any, n: Any) -> Any:
        if not jnp.issubdtype(jnp.result_type(n), jnp.inexact):
            return n
        return jnp.where(jnp.isfinite(n), n, o)

    return jax.tree.map(keep, old, new)


def replica_loss(loss: Any) -> Any:
    """A replica's Keras loss as a scalar: 0 for a replica with no rows (`div_no_nan`).

    Keras' loss reduction returns a loss of static shape ``(0,)`` unreduced (TF's traces
    see ``(None,)`` and reduce it with ``divide_no_nan`` to 0): reduced here by the same
    rule, the empty replica adds 0 to the loss, its gradient and the loss tracker (which
    it updates with weight 0, its row count), as in TF.

    >>> import jax.numpy as jnp
    >>> float(replica_loss(jnp.zeros((0,)))), float(replica_loss(jnp.float32(0.5)))
    (0.0, 0.5)
    """
    if jnp.ndim(loss) == 0:
        return loss
    return div_no_nan(jnp.sum(loss), jnp.size(loss))


def metrics_result(model: Any, metrics_variables: Any) -> dict:
    """Keras' logs (``model.get_metrics_result()``) for the given metric state."""
    mapping = list(zip(model.metrics_variables, metrics_variables))
    with keras.StatelessScope(state_mapping=mapping):
        return model.get_metrics_result()


class _Layout:
    """Which non-trainable variables are kept per replica, all-reduced, or replica 0's."""

    def __init__(self, model: Any, strategy: Any) -> None:
        aggregation = [v.aggregation for v in model.non_trainable_variables]
        self.own = tuple(i for i, a in enumerate(aggregation) if a == "none")
        self.mean = tuple(i for i, a in enumerate(aggregation) if a == "mean")
        self.sum = tuple(i for i, a in enumerate(aggregation) if a == "sum")
        self.sharding = variable_sharding(strategy)

    def with_copies(self, state: Any, copies: tuple, ctx: Any) -> Any:
        """The replica's state: its own copies of the per-replica variables."""
        if not self.own:
            return state
        rid = ctx.replica_id_in_sync_group
        ntv = list(state[1])
        for i, c in zip(self.own, copies):
            ntv[i] = jax.lax.dynamic_index_in_dim(c, rid, keepdims=False)
        return (state[0], ntv, *state[2:])

    def own_copies(self, ntv: Any) -> tuple:
        return tuple(ntv[i][None] for i in self.own)

    def combine(self, ctx: Any, old_mv: Any, new_mv: Any, ntv: Any, grads: Any) -> tuple:
        """One SUM all-reduce: gradients, metric updates, mean/sum-aggregated variables."""
        deltas = [new - old for new, old in zip(new_mv, old_mv)]
        agg = [ntv[i] for i in self.mean + self.sum]
        grads, deltas, agg = ctx.all_reduce(ReduceOp.SUM, (grads, deltas, agg))
        new_mv = [old + d for old, d in zip(old_mv, deltas)]
        ntv = list(ntv)
        n = ctx.num_replicas_in_sync
        for k, i in enumerate(self.mean + self.sum):
            ntv[i] = agg[k] / n if k < len(self.mean) else agg[k]
        return grads, new_mv, ntv

    def place(self, state: Any) -> Any:
        """Keras' state as mirrored arrays (replicated on the replica devices)."""
        return jax.tree.map(lambda v: jax.lax.with_sharding_constraint(v, self.sharding), state)


def variable_sharding(strategy: Any) -> jax.sharding.Sharding:
    """Where a variable of ``strategy`` lives: replicated on every replica device."""
    devices = list(strategy.extended.replicas.devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("batch",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
