"""Keras' own objects as typed state: their attribute assignments drawn as a new epoch.

A step over a Keras model depends on thousands of Python values in Keras' layers,
variables, optimizers, metrics and losses (`jaxdist._state.typed`). Every assignment
or deletion of an attribute of one of those objects goes through its class's
``__setattr__`` / ``__delattr__``; `install` wraps the ones of Keras' base classes
(``Layer``, which models and metrics' layers derive from, ``Metric``, the optimizers'
base, ``Loss`` and ``Variable``, and the configuration objects they hold: learning-rate
schedules, regularizers, constraints, initializers, dtype policies and input specs, the
last ones with ``object``'s) so that each draws a
new epoch before it assigns. The one assignment it leaves out is a variable's array
(``Variable._value``, Keras' private name for it: assigned on every optimizer step), which
the step reads as an input, checked by its shape and dtype on every call, never as a
watched value (`jaxdist._state.typed.register`'s ``unwatched``).

Keras' trackers (``keras.src.utils.tracking``: ``Tracker``, which keeps a layer's lists of
variables and layers, and ``TrackedList`` / ``TrackedDict`` / ``TrackedSet``, which a
layer makes of the lists, dicts and sets assigned to it) draw an epoch on each change too.

Private Keras API named: ``keras.src.backend.common.variables.Variable`` (the class every
backend's variable derives from) and its ``_value`` attribute, ``keras.src.utils.tracking``;
tests/keras_wing/test_typed_state.py holds them on every supported Keras.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras
from keras.src.backend.common.variables import Variable as _KerasVariable
from keras.src.utils import tracking as _tracking

from jaxdist._state import typed as _typed

UNWATCHED = frozenset({"_value"})  # a variable's array: an input, never a watched value


def _classes() -> list[type]:
    return [
        keras.layers.Layer,
        keras.metrics.Metric,
        keras.optimizers.Optimizer.__mro__[1],  # the optimizers' base (BaseOptimizer)
        keras.losses.Loss,
        _KerasVariable,
        # the objects a layer or an optimizer holds as its configuration, whose attributes
        # a program may change (``opt.learning_rate``'s schedule, ``kernel_regularizer.l2``)
        keras.optimizers.schedules.LearningRateSchedule,
        keras.regularizers.Regularizer,
        keras.constraints.Constraint,
        keras.initializers.Initializer,
        keras.DTypePolicy,
        keras.InputSpec,
    ]


# Keras' trackers and the containers they make of a layer's lists, dicts and sets: each
# method that changes what they hold (the methods of Python's own containers that these
# classes do not define are wrapped on them too: ``layer.items[0] = x``)
_MUTATORS: dict[str, list[str]] = {
    "Tracker": "track untrack add_to_store replace_tracked_value __setattr__".split(),
    "TrackedList": (
        "append insert extend remove pop clear __delitem__ __setitem__ __iadd__ __imul__ sort "
        "reverse"
    ).split(),
    "TrackedDict": "__setitem__ update pop popitem clear __delitem__ setdefault".split(),
    "TrackedOrderedDict": (
        "__setitem__ update pop popitem clear __delitem__ setdefault move_to_end"
    ).split(),
    "TrackedSet": (
        "add update remove discard pop clear __ior__ __iand__ __isub__ __ixor__ "
        "difference_update intersection_update symmetric_difference_update"
    ).split(),
}


def _wrap_method(original: Callable) -> Callable:
    def barrier(*args: Any, **kwargs: Any) -> Any:
        _typed.bump(_typed.ANY_PROGRAMS)  # (a tracker does not know whose it is)
        return original(*args, **kwargs)

    functools.update_wrapper(barrier, original)
    return barrier


def _wrap(original: Callable) -> Callable:
    def barrier(self: Any, name: str, *value: Any) -> Any:
        if name not in UNWATCHED:
            _typed.bump(self)
        return original(self, name, *value)

    functools.update_wrapper(barrier, original)
    return barrier


_DONE: list[bool] = []


def install() -> None:
    """Wraps the classes' ``__setattr__`` / ``__delattr__`` once (see the module docstring).

    >>> install()
    >>> layer = keras.layers.Dense(2)
    >>> before = _typed.epoch(); layer.trainable = False; _typed.epoch() > before
    True
    >>> _typed.is_typed_class(keras.layers.Dense)
    True
    """
    if _DONE:
        return
    _DONE.append(True)
    for cls in _classes():
        for name in ("__setattr__", "__delattr__"):
            wrapped = _wrap(getattr(cls, name))
            setattr(cls, name, wrapped)
            _typed.register(wrapped, unwatched=UNWATCHED)
    for class_name, methods in _MUTATORS.items():
        tracked = getattr(_tracking, class_name, None)
        for name in methods if tracked is not None else ():  # (a Keras without it)
            if hasattr(tracked, name):
                setattr(tracked, name, _wrap_method(getattr(tracked, name)))
