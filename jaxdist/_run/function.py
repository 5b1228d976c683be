"""`jd.function`: TF's ``tf.function`` for jaxdist, with the state on objects kept current.

TF programs keep their state in variables on objects (``self.w``, a model, an
optimizer) and compile their distributed step with ``@tf.function``; the variables
are captured by reference, so every call reads their values now, and an ``assign``
inside the function is seen after it. A plain ``jax.jit`` bakes what the function
reads from ``self`` or a global into the program as constants, and an assignment
inside it leaks a tracer.

``jd.function`` compiles the whole function (its ``strategy.run`` calls, reductions,
optimizer update) into one program, dispatched once per call, and gives it TF's
meaning, built on the same parts as the eager ``strategy.run``
(`jaxdist._state.stage.Staged`):

* the arrays and Python numbers it reads from its closure, globals and object, at
  any depth and inside the steps it gives ``strategy.run`` or any jitted helper, are
  inputs of the program, read afresh on every call;
* what it assigns into that state (``self.params = new``, ``state["w"] = ...``,
  ``self.step += 1``) is written back after the call, as ``tf.Variable.assign`` is:
  distributed values stay distributed;
* one trace per argument signature (arrays by shape and dtype, Python numbers traced,
  other Python values by value), and again when a Python value it depends on changes
  (a retrace warning after `WARN_AT` traces, as TF warns);
* called inside another JAX trace (``jax.jit``, a ``lax`` loop), it runs inline.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, cast

import jax
import numpy as np

from jaxdist._base import context as _context
from jaxdist._base import jax_internals as _jax_internals
from jaxdist._base import user_errors as _user_errors
from jaxdist._base.errors import OutOfRangeError
from jaxdist._base.validate import describe, is_number
from jaxdist._input import feeds as _feeds
from jaxdist._input.iterators import DatasetIterator, DistributedIterator
from jaxdist._program import compile as _compile
from jaxdist._run import concrete as _concrete
from jaxdist._run.signature import InputSignature, check_options
from jaxdist._state import aggregation as _aggregation
from jaxdist._state import arguments as _arguments
from jaxdist._state import capture as _capture
from jaxdist._state import chains as _chains
from jaxdist._state.calls import CONCRETE_JAX, is_concrete_jax
from jaxdist._state.stage import Staged, example

_DYNAMIC = "d"
_ITERATORS = (DistributedIterator, DatasetIterator)


def _signature(x: Any) -> Hashable:
    # (its shape, dtype and weak type are its aval's: read at once; the type's test in place)
    if type(x) in CONCRETE_JAX or is_concrete_jax(x):
        aval = x.aval
        return (aval.shape, aval.dtype, aval.weak_type)
    if isinstance(x, jax.Array):
        return (x.shape, x.dtype, getattr(x, "weak_type", False))
    if isinstance(x, np.ndarray):
        return (x.shape, x.dtype)
    return type(x).__name__


def _static_key(value: Any, index: int) -> Hashable:
    if isinstance(value, _ITERATORS):  # read through `_input.feeds`: a new one each epoch is alike
        return ("iterator", type(value))
    try:  # (an unhashable object holding state: by identity, `jaxdist._state.arguments.key`)
        return (type(value), _arguments.key(value))
    except TypeError:
        raise TypeError(
            f"jd.function arguments must be arrays, numbers, distributed values, objects or "
            f"hashable Python values; leaf {index} is an unhashable {type(value).__name__}. "
            "Convert it to an array, or keep it on the function's object or closure."
        ) from None


def _element_signature(element: Any) -> Hashable:
    leaves, treedef = jax.tree.flatten(element)
    return (treedef, tuple((np.shape(x), getattr(x, "dtype", type(x))) for x in leaves))


class _Call:
    """One call's elements of the distributed iterators the function reads (`_input.feeds`):
    fetched on the host, in order, once per call whichever traces ask for them."""

    def __init__(self, fn: Callable, leaves: list) -> None:
        self._fn, self._leaves = fn, leaves
        self._got: dict = {}

    @property
    def leaves(self) -> list:
        """The call's argument leaves."""
        return self._leaves

    def where(self, iterator: Any) -> Hashable:
        """An iterator's place: an argument's leaf, or a chain in the function's state."""
        for i, leaf in enumerate(self._leaves):
            if leaf is iterator:
                return ("arg", i, ())
        for i, leaf in enumerate(self._leaves):  # held by an argument (TF1's DatasetIterator)
            if isinstance(leaf, _ITERATORS):
                inner = _capture.locate(cast(Callable, leaf), [iterator])[0]
                if inner is not None:
                    return ("arg", i, inner)
        chain = _capture.locate(self._fn, [iterator])[0]
        if chain is None:
            raise RuntimeError(
                f"The jd.function {describe(self._fn)} read a distributed iterator that is "
                "neither one of its arguments nor in its state (its object, closure or "
                "globals), so later calls could not read it again: an iterator made inside "
                "the function (`for x in dataset` over a distributed dataset, "
                "`iter(dataset)`) is a new one on every call. Pass the iterator as an "
                "argument (it = iter(dist_dataset); fn(it), with `for x in it` or `next(it)` "
                "inside), or loop over the dataset outside and pass each batch."
            )
        return ("chain", chain, ())

    def take(self, source: Hashable, k: int, read: Callable | None = None) -> Any:
        """The ``k``-th element of ``source`` in this call (read now if not yet)."""
        key = (source, k)
        if key not in self._got:
            kind, at, inner = cast(tuple, source)
            iterator = self._leaves[at] if kind == "arg" else _chains.fetch(self._fn, at)
            iterator = _chains.fetch(iterator, inner)
            if read is None:
                self._got[key] = next(iterator)
            else:  # inside the trace: the batch is read and placed as eagerly, not traced
                with jax.ensure_compile_time_eval():
                    self._got[key] = read()
        return self._got[key]

    def fed(self, feeds: list) -> list | None:
        """The arrays of the elements a trace read (``feeds``), or None if one of them
        has another structure, shape or dtype now (a partial batch: another trace)."""
        out = []
        for source, k, signature in feeds:
            element = self.take(source, k)
            if _element_signature(element) != signature:
                return None
            out += jax.tree.leaves(element)
        return out


class _Program:
    """One trace of the function: the compiled program and how its outputs are read."""

    def __init__(
        self,
        fn: Callable,
        treedef: Any,
        kinds: tuple,
        statics: list,
        dyn: list,
        call: _Call,
        donate: bool,
        root: Callable,
    ) -> None:
        info: dict = {}
        feed = _feeds.Feed(call.where, call.take)

        def body(*arrays: Any) -> list:
            it, st = iter(arrays), iter(statics)
            leaves = [next(it) if k == _DYNAMIC else next(st) for k in kinds]
            args, kwargs = jax.tree.unflatten(treedef, leaves)
            feed.restart()
            with _context.enter(_context.function_state(fn)), _feeds.feeding(feed):
                out = fn(*args, **kwargs)
            flat, info["treedef"] = jax.tree.flatten(out)
            info["specs"] = _concrete.output_specs(out)
            # an element of an iterator it read, returned as it is (a one-replica run returns
            # its argument): an output of the program, not the first call's array
            read = {id(x) for _, _, e in feed.used for x in jax.tree.leaves(e)}
            flat = [jax.numpy.copy(x) if id(x) in read else x for x in flat]
            traced = [isinstance(x, jax.core.Tracer) for x in flat]
            info["layout"] = [None if t else x for x, t in zip(flat, traced)]
            return [x for x, t in zip(flat, traced) if t]

        examples = [example(x, False) for x in dyn]
        outputs = lambda: [x for x in info["layout"] if x is not None]  # noqa: E731
        fed = lambda: [x for _, _, e in feed.used for x in jax.tree.leaves(e)]  # noqa: E731
        stage = lambda: Staged(  # noqa: E731 - (its state: ``fn``'s, and its arguments')
            root, body, examples, outputs=outputs, numbers=True, writes=True, fed=fed
        )
        with _aggregation.spreading() as found:
            self.staged = stage()
        # a replica step read a sync-on-read variable's plain value (one the host assigned)
        # per replica: held in that form from now on, and traced again over it (one trace
        # for the host's value and the step's rows)
        self.spread = _aggregation.spread(root, found) if found else []
        if self.spread:
            self.staged = stage()
        self.feeds = [(s, k, _element_signature(e)) for s, k, e in feed.used]
        self._info = info
        # the arrays of the state it overwrites: their buffers may hold the new values
        donated = tuple(len(dyn) + i for i in self.staged.overwritten()) if donate else ()
        self.program = jax.jit(self.staged.evaluate, donate_argnums=donated)

    def inputs(self, fn: Callable, call: _Call) -> list | None:
        """The program's inputs after the arguments (None: this trace does not fit)."""
        fed = call.fed(self.feeds) if self.feeds else []
        if fed is None:  # (before the state: `inputs` stores the numbers it writes)
            return None
        state = self.staged.inputs(fn)
        return None if state is None else state + fed

    def result(self, fn: Callable, outs: list) -> Any:
        it = iter(outs)
        layout = self._info["layout"]
        leaves = [next(it) if x is None else self.staged.output(fn, x) for x in layout]
        return jax.tree.unflatten(self._info["treedef"], leaves)

    @property
    def output_specs(self) -> Any:
        """The outputs' structure with a `TensorSpec` per array (`concrete.output_specs`)."""
        return self._info["specs"]


class Function:
    """A function compiled whole, reading and writing its state as TF's ``tf.function``.

    Created by `function`; call it as the function. ``python_function`` is the
    function it wraps; ``input_signature`` the specs its calls are bound to (or None).
    """

    def __init__(
        self,
        fn: Callable,
        name: str | None = None,
        donate_state: bool = False,
        signature: InputSignature | None = None,
    ) -> None:
        self.python_function = fn
        self.donate_state = donate_state
        self._signature = signature
        self.input_signature = None if signature is None else signature.specs
        self.__name__ = name or getattr(fn, "__name__", "function")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __get__(self, obj: Any, objtype: Any = None) -> Function:
        if obj is None:
            return self
        method = types.MethodType(self.python_function, obj)
        sig = None if self._signature is None else self._signature.bound()
        return Function(method, self.__name__, self.donate_state, sig)

    def __repr__(self) -> str:
        return f"<jd.function {describe(self.python_function)}>"

    def experimental_get_tracing_count(self) -> int:
        """How many times the function was traced (TF's name): one per signature and state."""
        return _compile.steps.size(self.python_function)

    def get_concrete_function(self, *args: Any, **kwargs: Any) -> _concrete.ConcreteFunction:
        """TF's ``get_concrete_function``: the function for these specs (or values).

        With an ``input_signature``, the arguments may be left out (or must fit it). A
        signature of fully known shapes is traced now; with ``None`` dimensions, at the calls
        (one trace per shape, `jaxdist._run.concrete`).
        """
        fn, sig = self.python_function, self._signature
        if _jax_internals.tracing():
            raise RuntimeError(f"get_concrete_function of {describe(fn)} inside a JAX trace")
        if sig is None:
            sig = _concrete.signature_of(fn, args, kwargs)
        given = sig.bind(args, kwargs) if args or kwargs else sig.structured()
        made = _concrete.examples(*given)  # (traced now where every shape is known)
        outputs = None if made is None else self._invoke(*made, run=False).output_specs
        run = lambda a, k: self._invoke(a, k)  # noqa: E731
        return _concrete.ConcreteFunction(str(self.__name__), sig, run, outputs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._signature is not None:  # (checked before any work, as TF binds its inputs)
            args, kwargs = self._signature.bind(args, kwargs)
        return self._invoke(args, kwargs)

    def _invoke(self, args: tuple, kwargs: dict, run: bool = True) -> Any:
        fn = self.python_function
        if _jax_internals.tracing():  # inside another trace: inline, the outer trace owns it
            return fn(*args, **kwargs)
        leaves, treedef = jax.tree.flatten((args, kwargs))
        call = _Call(fn, leaves)
        code = getattr(fn, "__func__", fn)
        try:
            try:
                static = _STATIC_NUMBERS.get(code, False)
                return self._call(fn, (args, kwargs), treedef, call, static, run)
            except _user_errors.STEP_ERRORS as e:
                if not _user_errors.is_step_error(e):
                    raise
                if _STATIC_NUMBERS.get(code) or not any(is_number(x) for x in leaves):
                    _user_errors.raise_for_function(fn, e)
                # it needs a Python number's value (``range(steps)``, ``jnp.zeros(k)``):
                # numbers in its arguments are static from now on, as tf.function's are
                _STATIC_NUMBERS[code] = True
                del e
            try:
                return self._call(fn, (args, kwargs), treedef, call, True, run)
            except _user_errors.STEP_ERRORS as e:
                if not _user_errors.is_step_error(e):
                    raise
                _user_errors.raise_for_function(fn, e)
        except OutOfRangeError:
            raise
        except StopIteration as e:  # TF raises its OutOfRangeError from the call
            raise OutOfRangeError(f"End of sequence in {describe(fn)}: {e}") from None

    def _call(
        self, fn: Callable, given: tuple, treedef: Any, call: _Call, static: bool, run: bool
    ) -> Any:
        leaves = call.leaves
        kinds, dyn, statics, key = [], [], [], []
        for i, x in enumerate(leaves):
            if (
                type(x) in CONCRETE_JAX
                or isinstance(x, (jax.Array, np.ndarray))
                or (is_number(x) and not static)
            ):
                kinds.append(_DYNAMIC)
                dyn.append(x)
                key.append(_signature(x))
            else:
                kinds.append("s")
                statics.append(x)
                key.append(_static_key(x, i))  # an iterator: by its type (`_input.feeds`)
        full = ("jd.function", treedef, tuple(key), self.donate_state)
        held = _arguments.objects(leaves, [k == "s" for k in kinds]) if statics else []
        found = [(i, x) for i, x in held if not isinstance(x, _ITERATORS)]
        root = _arguments.root(fn, found, (*given, None)) if found else fn
        how = (tuple(kinds), statics, dyn, call, self.donate_state, root)
        build = lambda: _Program(fn, treedef, *how)  # noqa: E731
        spread = _spread_of(fn) if _SPREAD_AT else []
        if spread:  # (on-read places the host assigned since: per replica, as traced)
            _aggregation.respread(root, spread)
        entry, extra = _compile.steps.get(
            fn, full, build, lambda e: e.inputs(root, call), lambda e: e.staged
        )
        if entry.spread and not set(entry.spread) <= set(spread):
            _keep_spread(fn, list(dict.fromkeys([*spread, *entry.spread])))
        if not run:  # (`get_concrete_function`: traced, not run; the numbers put back)
            entry.staged.unread(root)
            return entry
        outs = entry.program(*dyn, *extra)
        entry.staged.write_back(root, outs)
        return entry.result(root, outs)


_CONCRETE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerBoolConversionError,
)
_STATIC_NUMBERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # code's functions
# the on-read places a function (a method, for its object) holds per replica, ``[(chain,
# replicas)]`` (`jaxdist._state.aggregation.spread`): each call puts a value the host
# assigned there since in that form before its trace is looked up. By the object's id, with
# a weak reference to it (its ``__hash__`` is not run): (id, function) -> (reference, places)
_SPREAD_AT: dict[tuple, tuple[weakref.ref, list]] = {}


def _spread_key(fn: Callable) -> tuple[Any, tuple]:
    owner = fn.__self__ if type(fn) is types.MethodType else fn
    return owner, (id(owner), fn.__func__ if type(fn) is types.MethodType else None)


def _spread_of(fn: Callable) -> list:
    owner, key = _spread_key(fn)
    found = _SPREAD_AT.get(key)
    return found[1] if found is not None and found[0]() is owner else []


def _keep_spread(fn: Callable, places: list) -> None:
    owner, key = _spread_key(fn)

    def forget(ref: weakref.ref) -> None:
        if _SPREAD_AT.get(key, (None,))[0] is ref:  # (not a newer object's with that id)
            del _SPREAD_AT[key]

    try:
        _SPREAD_AT[key] = (weakref.ref(owner, forget), places)
    except TypeError:  # (an object without weak references: its traces are not shared)
        return


def function(
    func: Callable | None = None,
    input_signature: Sequence[Any] | None = None,
    autograph: bool = True,
    jit_compile: bool | None = None,
    reduce_retracing: bool = False,
    experimental_implements: str | None = None,
    experimental_autograph_options: Any = None,
    experimental_attributes: dict | None = None,
    experimental_relax_shapes: bool | None = None,
    experimental_compile: bool | None = None,
    experimental_follow_type_hints: bool | None = None,
    *,
    donate_state: bool = False,
) -> Any:
    """TF's ``tf.function``: ``func`` compiled whole, its state read and written as TF does.

    Use it as a decorator (on functions and methods) or call it on a function. The
    function may call ``strategy.run``, ``strategy.reduce`` and any JAX code; the
    arrays and Python numbers it reads from ``self``, its closure or globals are read
    afresh on every call, and what it assigns there is written back after the call.
    ``next(iterator)`` of a distributed iterator inside it reads a new element on every
    call. Arrays and Python numbers in its arguments are traced (a number it needs the
    value of, ``range(steps)``, makes them static, as in TF); other Python values are
    static. It takes TF 2.21's arguments, in TF's order.

    Args:
        func: the function (or method) to compile.
        input_signature: a list or tuple of `TensorSpec` structures, one per argument
            (``self`` takes none): every call is bound to it before any work, as TF binds
            it (`jaxdist._run.signature`); a ``None`` dimension takes any size there.
            JAX traces one program per concrete shape (TF one graph with unknown sizes).
        autograph: TF's option. jaxdist has no AutoGraph: Python control flow runs at
            trace time, which is ``autograph=False``'s meaning; with True, a Python ``if``
            on a traced value is an error naming ``lax.cond``.
        jit_compile: TF's option: XLA compiles every function (False is accepted, as TF
            accepts it on TPUs, where XLA compiles everything too).
        reduce_retracing: TF's option (accepted): JAX needs static shapes, so one trace
            per shape stays one trace per shape; use ``None`` dimensions in an
            ``input_signature`` to say which shapes may vary.
        experimental_implements: TF's annotation of the function (a str; no effect).
        experimental_autograph_options: AutoGraph's options (no effect: no AutoGraph).
        experimental_attributes: TF's function attributes (a dict; no effect).
        experimental_relax_shapes: the old name of ``reduce_retracing``.
        experimental_compile: the old name of ``jit_compile``.
        experimental_follow_type_hints: TF's option (no effect): arguments annotated as
            tensors are traced in TF; jaxdist traces Python numbers already.
        donate_state: donate the buffers of the arrays it overwrites in its state
            (``self.params = new``) to the program (``jax.jit``'s ``donate_argnums``):
            their memory holds the new values; the old arrays are deleted after a call.

    Returns:
        A `Function` (or a decorator making one when ``func`` is None).

    Raises:
        TypeError: ``func`` is not callable, an option has the wrong type, or
            ``input_signature`` is not a structure of specs that fits ``func``'s
            parameters (TF's rules).

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> strategy = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> class Trainer:
    ...     def __init__(self):
    ...         self.w = jnp.ones(())
    ...     def step(self, x):
    ...         return jd.get_replica_context().all_reduce("SUM", x * self.w)
    ...     @jd.function
    ...     def train(self, x):
    ...         total = strategy.run(self.step, args=(x,))
    ...         self.w = self.w + 1.0          # written back after the call
    ...         return total
    >>> t = Trainer()
    >>> float(t.train(jnp.ones(())).values[0]), float(t.train(jnp.ones(())).values[0])
    (2.0, 4.0)
    >>> float(t.w)
    3.0
    >>> @jd.function(input_signature=[jd.TensorSpec((None,), "float32")])
    ... def total(x):
    ...     return x.sum()
    >>> float(total(jnp.ones(3))), float(total([1.0, 2.0]))
    (3.0, 3.0)
    """
    if type(donate_state) is not bool:
        raise TypeError(f"jd.function(donate_state=...) takes a bool; got {donate_state!r}.")
    check_options(
        autograph=autograph,
        jit_compile=jit_compile,
        reduce_retracing=reduce_retracing,
        experimental_implements=experimental_implements,
        experimental_attributes=experimental_attributes,
        experimental_relax_shapes=experimental_relax_shapes,
        experimental_compile=experimental_compile,
        experimental_follow_type_hints=experimental_follow_type_hints,
    )
    if func is None:
        return functools.partial(
            function, input_signature=input_signature, donate_state=donate_state
        )
    if not callable(func):
        raise TypeError(f"jd.function(func) takes a function or method; got {type(func).__name__}.")
    sig = None if input_signature is None else InputSignature.of(func, input_signature)
    made = Function(func, donate_state=donate_state, signature=sig)
    return functools.wraps(func, updated=())(made)
