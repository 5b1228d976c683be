"""The data-parallel ``train_function`` / ``test_function`` / ``predict_function`` of a Keras
model built in a strategy's scope, TF's way (see `jaxdist._keras.distribution`).

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
each) contributes nothing: the rule of `jaxdist._keras.replica.is_empty`, its loss
reduced by the custom loops' `jaxdist._strategy.nn.div_no_nan`.

One all-reduce per step carries gradients, metric updates and aggregated
variables. The program is traced once per input signature (a full batch and a
partial batch are two; ``steps_per_execution`` full batches in one program a
third); `traces` counts it. Batches of NumPy arrays that split evenly go to the
program as they are, and ``steps_per_execution=k`` full batches run as one
program (`jaxdist._keras.fused`); other batches are split by the strategy's
`Placer`, and whole batches (``*_on_batch``) or several processes take the
placed path (`StepFunction._placed_steps`). Its dispatches stay under the
in-flight bound (`jaxdist._base.inflight`). With several workers, jaxdist traces no
partial batch inside `jax.jit`: that step runs eagerly through ``strategy.run``
(`StepFunction._eager`), on each worker's copy of the state.

A model that overrides ``train_step``/``test_step``/``predict_step`` runs its own step per
replica instead (`jaxdist._keras.override`: TF's meaning of its losses, optimizers and metrics),
in the same programs; one that overrides only ``compute_loss`` runs Keras' step with TF's
meaning of that loss (`train_replica`'s ``tf_loss``).

On one replica (a `OneDeviceStrategy` or a one-device `MirroredStrategy` scope), a batch the
host split takes runs a direct program (`StepFunction._one_program`): Keras' own step with
the one replica's (identity) rules, no per-replica copies, no marker output, no layout
constraint: the program plain Keras compiles for its donated train step, op for op.
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

from jaxdist._base import inflight as _inflight
from jaxdist._base.layout import rows_as_replicated
from jaxdist._base.options import InputOptions
from jaxdist._input.place import Placer
from jaxdist._keras.fused import host_split, numpy_rows, same_shapes, scan_steps
from jaxdist._keras.override import (
    metrics_part,
    optimizer_variables,
    other_optimizers,
    overrides,
    own_loss,
    replica_step,
)
from jaxdist._keras.replica import Layout, restore_variables, test_replica, train_replica
from jaxdist._keras.tfloss import install as install_tf_meaning
from jaxdist._state.replica import explicit_state
from jaxdist._strategy.default import get_replica_context
from jaxdist._values.layout import stacked
from jaxdist._values.values import from_stacked, is_distributed

_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> {slot key: (the primary of a per-replica variable as last returned, every replica's
copies)} (`Layout.keys`)."""

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
    install_tf_meaning()
    return StepFunction(model, strategy, kind)


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
        self.override = overrides(model, kind)  # the model's own step (`jaxdist._keras.override`)
        self.tf_loss = own_loss(model) and not self.override
        self.layout = Layout(model, strategy, metrics_part(kind) if self.override else None)
        # a model's own train_step: the optimizers outside Keras' state whose state it keeps
        self.others = other_optimizers(model) if self.override and kind == "train" else []
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
        if self._n > 1:  # batches split over the replicas' devices as the program reads them
            shardings = (None, None, replicas.sharding)
            self._fast = jax.jit(self._fast_program, donate_argnums=(0, 1), in_shardings=shardings)
        else:  # the direct one-replica program (no in_shardings: JAX's quickest dispatch)
            self._fast = jax.jit(self._one_program, donate_argnums=0)
        # `__call__`'s shortest path: one replica in this process, Keras' NumPy batches
        self._direct = self._n == 1 and self._host_ok

    def model(self) -> Any:
        model = self.model_ref()
        if model is None:
            raise ReferenceError(f"the Keras model of this {self.kind}_function was deleted")
        return model

    def __call__(self, state: Any, iterator: Any) -> tuple[Any, Any]:
        try:
            if not self.others:
                return self._call(state, iterator)
            variables = optimizer_variables(self.others)  # read afresh, written back after
            outputs, new = self._call((*state, [v.value for v in variables]), iterator)
        except StopIteration:
            raise
        except Exception:  # the model keeps its weights (Keras emptied them for the epoch)
            restore_variables(self.model(), state)
            raise
        for v, value in zip(variables, new[-1]):
            v.assign(value)
        return outputs, tuple(new[:-1])

    def _call(self, state: Any, iterator: Any) -> tuple[Any, Any]:
        k = max(1, int(self.model().steps_per_execution))
        if k == 1 and self._direct and not _WHOLE_BATCH.get():  # one replica, one step
            batch = next(iterator)
            if type(batch) is tuple and batch and numpy_rows(batch):  # Keras' own (x, y)
                return self._run_fast(state, (batch,))
            return self._step_on(state, batch)
        if _WHOLE_BATCH.get() or not self._host_ok:
            with self.strategy.scope():
                return self._placed_steps(state, iterator, k)
        if k == 1:  # the common case, with no lists of batches and outputs
            return self._step_on(state, next(iterator))
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

    def _step_on(self, state: Any, batch: Any) -> tuple[Any, Any]:
        """One step on ``batch``: as it is, or split on the host (`host_split`), else
        placed by the strategy (a partial batch, leaves the host split does not take)."""
        x = host_split(batch, self._n, self._device)
        if x is not None:
            return self._run_fast(state, (x[0],))
        return self._one(state, self._placer.split(batch, "the Keras batch"))

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
        if self._n == 1:
            outputs, state = self._fast(state, batches)
            self._returned = state
            return outputs, state
        outputs, state, copies, marker = self._fast(state, self._copies_for(state), batches)
        if self._n > 1:  # one device: no collective to bound
            _inflight.throttle(marker, f"model.{self.kind}")
        return outputs, self._keep(state, copies)

    def _own(self, state: Any) -> Any:
        if state is not self._returned:  # Keras' variables: some may have been built outside
            state = jax.device_put(tuple(list(s) for s in state), self.layout.sharding)
        return state

    def _keep(self, state: Any, copies: tuple) -> Any:
        if self.layout.slots:
            kept = _COPIES.setdefault(self.model(), {})
            for k, ((p, i), key) in enumerate(zip(self.layout.slots, self.layout.keys)):
                kept[key] = (state[p][i], copies[k])
        self._returned = state
        return state

    def _copies_for(self, state: Any) -> tuple:
        """Every replica's copy of each slot: as the last step left them while Keras' variable
        still holds the value it gave it (train and test functions share them: `evaluate`
        reads the batch-norm statistics each replica trained), else from Keras' value."""
        kept = _COPIES.get(self.model(), {})
        out = []
        for k, ((p, i), key) in enumerate(zip(self.layout.slots, self.layout.keys)):
            primary, copies = kept.get(key, (None, None))
            if state[p][i] is not primary:
                copies = self.layout.spread(k, state[p][i], self.strategy.num_replicas_in_sync)
            out.append(copies)
        return tuple(out)

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

    def _one_program(self, state: Any, batches: tuple) -> tuple:
        """One replica: Keras' steps on the batches as they are, and nothing else. The one
        replica's copy of a per-replica variable is the variable (no copies kept apart), no
        marker output (no collective to bound in flight), no layout constraint, no
        gather: the program plain Keras compiles, in the step's one-replica context."""
        self.traces += 1
        with self.strategy.scope():
            concat, unroll = self.kind == "predict", self._device.platform == "cpu"
            outputs, state, _ = scan_steps(self._one_step, state, (), batches, concat, unroll)
        return outputs, state

    def _one_step(self, state: Any, copies: tuple, raw: Any) -> tuple:
        slots = self.layout.slots
        copies = tuple(state[p][i][None] for p, i in slots)
        outputs, state, copies = self.strategy.run(self._replica, args=(state, copies, raw))
        state = [list(s) for s in state]
        for k, (p, i) in enumerate(slots):
            state[p][i] = copies[k][0]
        return outputs, tuple(state), ()

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
        for k, (p, i) in enumerate(self.layout.slots):  # as TF reads it (replica 0's: primary)
            state[p][i] = self.layout.primary(k, copies[k])
        return outputs, place(tuple(state)), place(copies)

    def _same_everywhere(self, out: Any, state: list) -> list:
        """``state`` (replica 0's) with the variables that are one value on every replica
        (trainable, optimizer and metric variables; all-reduced non-trainable ones) kept
        where each replica computed them (`rows_as_replicated`): no copy of the model
        from replica 0 to the others on every step."""
        state = [list(part) for part in state]
        if self._n == 1:
            return state
        slots = set(self.layout.slots)
        same = [
            (p, i)
            for p, part in enumerate(out)
            for i, v in enumerate(part)
            if (p != 1 or i in self.layout.mean + self.layout.sum)
            and (p, i) not in slots
            and is_distributed(v)
        ]
        rows = rows_as_replicated([stacked(out[p][i]) for p, i in same], self._replicas)
        for (p, i), v in zip(same, rows):
            state[p][i] = v
        return state

    @explicit_state  # Keras' state comes in as arguments and goes out as outputs
    def _replica(self, state: Any, copies: tuple, data: Any) -> tuple:
        ctx = get_replica_context()
        model = self.model()
        state = self.layout.with_copies(state, copies, ctx)
        if self.override:
            return replica_step(model, ctx, self.layout, self.kind, state, data, self.others)
        x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
        if self.kind == "predict":
            y_pred, ntv = model.predict_step(state, data)
            return y_pred, (state[0], ntv), self.layout.own_copies((state[0], ntv))
        if self.kind == "train":
            return train_replica(model, ctx, self.layout, state, (x, y, sw), self.tf_loss)
        return test_replica(model, ctx, self.layout, state, (x, y, sw), self.tf_loss)
