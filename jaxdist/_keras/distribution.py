"""Keras 3 (JAX backend) under a jaxdist strategy: the only module that knows Keras.

Loaded lazily by `jaxdist._base.integrations` the first time a ``strategy.scope()`` is
entered while Keras is imported; ``import jaxdist`` never imports it.

Variables. Inside a scope the Keras distribution hook (``keras.distribution``,
public) is a `StrategyDistribution`: every variable Keras creates there (model,
optimizer, metric) is placed replicated on the strategy's replica devices (one
device for `OneDeviceStrategy`), and remembered as the strategy's, so the model
knows its strategy outside the scope too (TF's ``model.distribute_strategy``).

Training. Keras' JAX trainer keeps state as explicit lists of arrays and calls
``model.train_function(state, iterator)``; for a model whose variables belong to
a strategy, `make_train_function` / `make_test_function` / `make_predict_function`
build that function here (`jaxdist._keras.steps`), running Keras' stateless
methods per replica through ``strategy.run`` TF's way. These three methods are
patched on ``keras.Model`` once, when this module loads; models without a
strategy keep Keras' own functions.

Private Keras API used (covered by tests/keras_wing/test_keras.py, Keras pinned to the
range `SUPPORTED`): the ``train_function``/``test_function``/``predict_function``
protocol of ``keras/src/backend/jax/trainer.py`` (``(state, iterator) -> (logs,
state)``), ``Model._update_metrics_variables`` (the metric update Keras' own
JAX ``train_step`` makes) and ``keras.src...DataAdapter`` (`DistributedDatasetAdapter`).
`fit`/`evaluate`/`predict` and the ``*_on_batch`` methods are wrapped as well, to accept
jaxdist distributed datasets and to give ``*_on_batch`` TF's whole-batch replicas.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from typing import Any

import jax
import keras
from keras.src.trainers.data_adapters.data_adapter import DataAdapter

from jaxdist._base import context as _context
from jaxdist._input.iterators import DistributedDataset
from jaxdist._keras import batches as _keras_batches
from jaxdist._keras import replica as _keras_replica
from jaxdist._keras import steps as _keras_steps
from jaxdist._keras import syncbn as _keras_syncbn
from jaxdist._keras import typed as _keras_typed
from jaxdist._keras import variables as _keras_variables
from jaxdist._keras.batches import OneDeviceLayout

SUPPORTED = ((3, 10), (3, 16))
"""Keras versions this module is written against: ``>= 3.10, < 3.16``."""

_OWNER: dict[int, Any] = {}
"""``id(variable)`` -> the strategy whose scope created it (held as long as the variable lives,
as a TF model holds its ``distribute_strategy``)."""

_CREATED_IN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> the strategy whose scope was active when the model was created (TF's
``model.distribute_strategy``): its ``fit`` outside the scope enters that scope, as TF's does."""

_DISTRIBUTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PATCHED: dict[str, Any] = {}


def _version() -> tuple[int, int]:
    major, minor = keras.__version__.split(".")[:2]
    return int(major), int(minor)


def check_keras() -> None:
    """Raises unless Keras runs on the JAX backend at a supported version."""
    backend = keras.backend.backend()
    if backend != "jax":
        raise RuntimeError(
            f"jaxdist runs Keras on the JAX backend only, but Keras' backend is {backend!r}. "
            "Set the environment variable KERAS_BACKEND=jax before Keras is imported "
            f"(KERAS_BACKEND is {os.environ.get('KERAS_BACKEND')!r})."
        )
    lo, hi = SUPPORTED
    if not lo <= _version() < hi:
        raise RuntimeError(
            f"jaxdist supports Keras >= {lo[0]}.{lo[1]}, < {hi[0]}.{hi[1]}; Keras "
            f"{keras.__version__} is installed. Install a supported one: "
            "pip install 'jaxdist[keras]'."
        )


class StrategyDistribution(keras.distribution.DataParallel):
    """Keras' distribution hook for a jaxdist strategy's scope.

    Variables are replicated on the strategy's replica devices (mirrored, as TF's
    ``MirroredVariable``); input batches stay whole on the first replica device,
    for the strategy's own split (and Keras' epoch iterator hands them over as the host
    has them: `jaxdist._keras.batches`); intermediate tensors keep their layout.
    """

    def __init__(self, strategy: Any) -> None:
        devices = list(strategy.extended.replicas.devices)
        mesh = keras.distribution.DeviceMesh((len(devices),), ["batch"], devices=devices)
        super().__init__(device_mesh=mesh, auto_shard_dataset=False)
        self.strategy_ref = weakref.ref(strategy)
        self.variable_sharding = _keras_replica.variable_sharding(strategy)
        # this process's first replica device (several workers: device 0 may be another's)
        local = [d for d in devices if d.process_index == jax.process_index()] or devices
        self.data_layout = OneDeviceLayout(jax.sharding.SingleDeviceSharding(local[0]))

    def get_variable_layout(self, variable: Any) -> jax.sharding.Sharding:
        key = id(variable)
        _OWNER[key] = self.strategy_ref()
        weakref.finalize(variable, _OWNER.pop, key, None)
        return self.variable_sharding

    def get_data_layout(self, data_shape: Any) -> keras.distribution.TensorLayout:
        return self.data_layout

    def get_tensor_layout(self, path: str) -> None:
        return None

    def distribute_dataset(self, dataset: Any) -> Any:
        return dataset


@contextlib.contextmanager
def enter_scope(strategy: Any) -> Iterator[None]:
    """``strategy.scope()``'s Keras part: Keras variables created in it are the strategy's."""
    check_keras()
    _install()
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(_distribution_for(strategy))
    try:
        yield
    finally:
        # Keras' distribution follows jaxdist's state as it is after this exit (scopes may be
        # exited out of order, and the one before may be another strategy's or Keras' own).
        now = _context.current().strategy  # a scope's, or experimental_set_strategy's
        if now is not None:
            keras.distribution.set_distribution(_distribution_for(now))
        elif not isinstance(previous, StrategyDistribution):
            keras.distribution.set_distribution(previous)
        else:
            keras.distribution.set_distribution(None)


def _distribution_for(strategy: Any) -> StrategyDistribution:
    dist = _DISTRIBUTIONS.get(strategy)
    if dist is None:
        dist = _DISTRIBUTIONS[strategy] = StrategyDistribution(strategy)
        _agree_on_a_seed(strategy)
    return dist


def _agree_on_a_seed(strategy: Any) -> None:
    """Several workers draw the same initial weights (TF broadcasts the chief's values)."""
    if (
        strategy.extended.replicas.multi_process
        and keras.src.utils.rng_utils.get_random_seed() is None
    ):
        # Private Keras API: the seed agreement of Keras' own multi-host set-up.
        keras.src.backend.jax.distribution_lib.initialize_rng()


def strategy_of(model: Any) -> Any:
    """The strategy whose scope created ``model``'s variables, or None (Keras' own path).

    >>> import keras, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> with s.scope():
    ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> strategy_of(model) is s
    True
    >>> kernel = model.weights[0].value          # mirrored on both replica devices
    >>> kernel.sharding.is_fully_replicated, len(kernel.sharding.device_set)
    (True, 2)

    Raises:
        RuntimeError: some of the variables belong to another strategy, or were
            created outside any scope while the others were created in one.
    """
    owners = {}
    for v in model.variables:
        owners[v.path] = _OWNER.get(id(v))
    found = {id(s): s for s in owners.values() if s is not None}
    if not found:
        return None
    if len(found) > 1 or None in owners.values():
        stray = [p for p, s in owners.items() if s is None][:3]
        raise RuntimeError(
            "The variables of this Keras model belong to different strategies "
            f"({list(found.values())!r}; created outside any scope: {stray}). Build, compile "
            "and train the model with one strategy: create it (layers, optimizer, metrics) "
            "inside that strategy's scope()."
        )
    return next(iter(found.values()))


def _install() -> None:
    """Patches Keras' step-function factories once (see the module docstring)."""
    if _PATCHED:
        return
    _keras_syncbn.install()
    _keras_variables.install()
    _keras_typed.install()
    _keras_batches.install()
    _PATCHED["__init__"] = keras.Model.__init__
    keras.Model.__init__ = _remembering_its_scope(keras.Model.__init__)
    for kind in ("train", "test", "predict"):
        name = f"make_{kind}_function"
        _PATCHED[name] = original = getattr(keras.Model, name)
        setattr(keras.Model, name, _make_factory(kind, original))
        name = {"train": "fit", "test": "evaluate", "predict": "predict"}[kind]
        _PATCHED[name] = original = getattr(keras.Model, name)
        setattr(keras.Model, name, _accepting_distributed_datasets(original))
        name = f"{kind}_on_batch"
        _PATCHED[name] = original = getattr(keras.Model, name)
        setattr(keras.Model, name, _on_batch(original))
    for name in ("save", "save_weights"):
        _PATCHED[name] = original = getattr(keras.Model, name)
        setattr(keras.Model, name, _outside_the_distribution(original))


def _outside_the_distribution(original: Any) -> Any:
    """``Model.save`` / ``save_weights`` with no strategy distribution active: saving reads
    the variables and creates nothing the strategy should own (Keras' saver builds a
    throw-away optimizer to list attributes to skip). In a multi-worker scope such a
    variable would be placed across every worker, a collective that workers not saving
    never join: TF asks every worker to call ``save``; jaxdist lets the chief save alone,
    inside the scope or outside it."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        current = keras.distribution.distribution()
        if not isinstance(current, StrategyDistribution):
            return original(self, *args, **kwargs)
        keras.distribution.set_distribution(None)
        try:
            return original(self, *args, **kwargs)
        finally:
            keras.distribution.set_distribution(current)

    method.__name__ = original.__name__
    method.__doc__ = original.__doc__
    return method


def _check_no_scope(model: Any, kind: str) -> None:
    current = keras.distribution.distribution()
    if isinstance(current, StrategyDistribution):
        raise RuntimeError(
            f"{type(model).__name__} {model.name!r} was built outside any strategy.scope(), "
            f"and its {kind} step is called inside the scope of {current.strategy_ref()!r}. "
            "Create the model (layers, optimizer, compile) inside that scope, as with TF's "
            "tf.distribute, or call it outside the scope to run on one device."
        )


class DistributedDatasetAdapter(DataAdapter):
    """A jaxdist distributed dataset as a Keras data adapter (TF's ``fit`` accepts
    ``strategy.experimental_distribute_dataset(ds)``).

    Each step's per-replica batch is gathered into the global batch, which the
    model's step splits again the same way (TF's split; distributed datasets whose
    replicas hold other sizes than that split are refused by ``strategy.gather``
    or re-split). Private Keras API: Keras' ``DataAdapter`` base class, which
    ``fit`` accepts in place of data.
    """

    def __init__(self, dataset: DistributedDataset, strategy: Any) -> None:
        self.dataset = dataset
        self.strategy = strategy

    def _batches(self) -> Iterator[Any]:
        for batch in self.dataset:
            yield self.strategy.gather(batch, axis=0)

    def get_numpy_iterator(self) -> Iterator[Any]:
        return self._batches()

    def get_jax_iterator(self) -> Iterator[Any]:
        return self._batches()

    def get_tf_dataset(self) -> Any:
        raise NotImplementedError("a jaxdist distributed dataset has no tf.data form")

    def get_torch_dataloader(self) -> Any:
        raise NotImplementedError("a jaxdist distributed dataset has no torch form")

    @property
    def num_batches(self) -> int | None:
        try:
            return len(self.dataset)
        except TypeError:
            return None

    @property
    def batch_size(self) -> None:
        return None

    @property
    def has_partial_batch(self) -> None:
        return None

    @property
    def partial_batch_size(self) -> None:
        return None


def _remembering_its_scope(original: Any) -> Any:
    """``keras.Model.__init__`` that records the strategy whose scope is active (`_CREATED_IN`)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        strategy = _context.current().strategy
        if strategy is not None:
            _CREATED_IN[self] = strategy

    __init__.__doc__ = original.__doc__
    return __init__


@contextlib.contextmanager
def _in_its_scope(model: Any) -> Iterator[None]:
    """The scope of the strategy ``model`` was created in, when no strategy is active: its
    variables not built yet (a subclassed model built by its first ``fit``) are built there
    and are the strategy's, as in TF, where ``fit`` enters ``model.distribute_strategy``."""
    strategy = _CREATED_IN.get(model)
    if strategy is None or _context.current().strategy is not None:
        yield
        return
    with strategy.scope():
        yield


def _accepting_distributed_datasets(original: Any) -> Any:
    def method(self: Any, x: Any = None, *args: Any, **kwargs: Any) -> Any:
        with _in_its_scope(self):
            return _fit_like(self, original, x, *args, **kwargs)

    method.__name__ = original.__name__
    method.__doc__ = original.__doc__
    return method


def _fit_like(self: Any, original: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    """``fit``/``evaluate``/``predict`` taking a jaxdist distributed dataset as ``x``."""
    if isinstance(x, DistributedDataset):
        strategy = strategy_of(self)
        if strategy is None:
            raise ValueError(
                f"x is a jaxdist distributed dataset, but {type(self).__name__} "
                f"{self.name!r} was not built in a strategy's scope(): build it in the "
                "scope of the strategy that distributed the dataset."
            )
        x = DistributedDatasetAdapter(x, strategy)
    return original(self, x, *args, **kwargs)


def _on_batch(original: Any) -> Any:
    def on_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if strategy_of(self) is None:
            return original(self, *args, **kwargs)
        with _keras_steps.whole_batch():
            return original(self, *args, **kwargs)

    on_batch.__name__ = original.__name__
    on_batch.__doc__ = original.__doc__
    return on_batch


def _make_factory(kind: str, original: Any) -> Any:
    attr = f"{kind}_function"

    def make_function(self: Any, force: bool = False) -> Any:
        strategy = strategy_of(self)
        if strategy is None:
            _check_no_scope(self, kind)
            return original(self, force)
        with strategy.scope():  # TF's error when called in another strategy's scope
            pass
        current = getattr(self, attr, None)
        if current is not None and not force and _keras_steps.is_for(current, strategy):
            return current
        fn = _keras_steps.make_function(self, strategy, kind)
        setattr(self, attr, fn)
        return fn

    make_function.__name__ = f"make_{kind}_function"
    make_function.__doc__ = (
        f"Keras' ``make_{kind}_function``; for a model built in a jaxdist scope, the "
        "strategy's data-parallel step (jaxdist._keras.distribution)."
    )
    return make_function
