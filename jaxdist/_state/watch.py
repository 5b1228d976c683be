"""The Python values a traced step depends on besides its arrays, and tracers it leaks.

A trace bakes in the Python numbers, strings and functions the step reads from its
state (`watch` records them before the trace; `changed` tells when one moved, which
means a new trace, as a new static argument does). A JAX value the step stores in its
state during the trace (`leaked`) is an error: the assignment would happen once.
The walk from the step function to its state is `jaxdist._state.capture`'s; the words
for what the checks found are `jaxdist._state.checks`'s, and when two functions are
the same step `jaxdist._state.keys`'s.
"""

from __future__ import annotations

import collections
import decimal
import enum
import fractions
import functools
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxdist._state import capture as _capture
from jaxdist._state import chains as _chains
from jaxdist._state import names as _names
from jaxdist._state import peek as _peek
from jaxdist._state import ran as _ran
from jaxdist._state import reach as _reach
from jaxdist._state import typed as _typed
from jaxdist._state.chains import Chain, describe
from jaxdist._state.keys import KeyWatch, function_key
from jaxdist._state.promote import is_number


def leaked(fn: Callable) -> str | None:
    """Where ``fn``'s state holds a JAX tracer (a value the step computed and stored,
    ``self.w = self.w + g``), as Python would name it; None if nowhere."""
    for chain, child in _capture.walk(fn, set()):
        if _peek.is_a(child, jax.core.Tracer):
            return describe(fn, chain)
    return None


def watch(fn: Callable, seen: list | None = None) -> tuple[tuple[Chain, Any, str], ...]:
    """The Python numbers, strings and functions ``fn`` reads from its state (through
    names its code uses, a few levels deep), with their values now, and the classes of
    the objects it reads there. A trace depends on them: `changed` tells when one moved.
    ``seen``, where given, gets every ``(chain, value)`` the walk reached.

    Values: numbers, strings, None, NumPy scalars and 0-d arrays (JAX inlines those in
    the program, so they are compared by value, a copy being kept); the members of a set
    or frozenset (a copy, compared as a set: ``self.frozen.add("a")``). Identity: Enum
    members (``self.phase = Phase.EVAL``), functions and other callables that are not
    objects of a Python class (``jnp.tanh``, a jitted function). Class: other objects
    (``self.loss = Huber()`` in place of ``MSE()``).
    Size: lists, tuples, deques, dicts and partials (an entry added to what the step iterates over).
    Values under dict keys that the code names come first in the bound.

    >>> box = {"lr": 0.1}
    >>> step = lambda x: x * box["lr"]
    >>> seen = watch(step)
    >>> changed(step, seen)
    False
    >>> box["lr"] = 0.2
    >>> changed(step, seen)
    True
    """
    out: list[tuple[Chain, Any, str]] = []
    named: set[str] = set()
    libraries = []  # modules of the standard library and installed packages
    limits: dict = {}
    opaque = []
    walked = list(_capture.walk(fn, named, limits))
    if seen is not None:
        seen += walked
    probes = _names.probed(named)  # attributes the code may find absent
    for chain, value in walked:
        if _peek.is_a(value, _capture.OPAQUE):
            opaque.append(chain)
        if _peek.is_a(value, types.ModuleType) and not _capture.user_module(value):
            libraries.append((chain, value))
        entry = classify(chain, value)
        if entry is not None:
            out.append(entry)
            if entry[2] == "type" and probes:
                out += _absent(chain, value, probes)
    out += _library_values(libraries, named)
    keys = named | _code_strings(fn)
    by_name = _names.BY_NAME in named
    out = [w for w in out if _capture.is_named(w[0], named) or (by_name and _by_name(fn, w, named))]
    out += _absent_globals(fn, walked)
    _expect_trace(fn, out, walked, named)
    out.sort(key=lambda w: (not all(k in keys for kind, k in w[0] if kind == "item"), _ORDER[w[2]]))
    _warn_opaque(fn, [c for c in opaque if _capture.is_named(c, named)])
    if limits.get("truncated"):
        warnings.warn(
            f"jaxdist looked at {_capture.MAX_NODES:,} objects reachable from the step "
            f"{getattr(fn, '__qualname__', fn)!r} and stopped: Python numbers and strings it "
            "reads beyond them keep the value they had when it was traced. Pass changing "
            "numbers to strategy.run as arguments.",
            RuntimeWarning,
            stacklevel=6,
        )
    return _bounded(fn, out)


def classify(chain: Chain, value: Any) -> tuple[Chain, Any, str] | None:
    """How a trace depends on ``value``, read at ``chain``: `watch`'s entry for it (the
    value kept and how it is compared), None where it is not compared (arrays and
    tracers: inputs; modules, classes, methods: their parts are).

    >>> classify((("global", "lr"),), 0.1)
    ((('global', 'lr'),), 0.1, 'value')
    >>> classify((("global", "w"),), np.ones(3)) is None
    True
    """
    if _peek.is_a(value, np.ndarray) and value.ndim == 0 and value.dtype != object:
        return chain, value.copy(), "value"
    if type(value) in _EXACT or _peek.is_a(value, np.generic) or type(value) in _NUMBERS:
        return chain, value, "value"
    if _peek.is_a(value, enum.Enum):  # ``self.phase = Phase.EVAL``: its member
        return chain, value, "member"
    if _peek.is_a(value, (set, frozenset)):  # ``self.frozen.add(name)``: a copy
        return chain, (type(value), frozenset(value)), "set"
    if _peek.is_a(value, (list, dict, functools.partial, tuple, collections.deque)):
        return chain, size(value), "size"  # an entry more: ``for w in self.ws``
    if _peek.is_a(value, _PARTS):
        return None  # arrays are inputs; tuples, methods: their parts
    if by_identity(type(value)):  # a strategy: itself
        return _identity(chain, value)
    if _tree_def(value) is not None:  # a pytree node (an nnx.Param): its structure
        return chain, _tree_def(value), "tree"
    if _peek.instance_dict(value) is not None and not _plain_callable(value):
        return chain, type(value), "type"
    if type(value) is types.FunctionType:  # the same code over the same captures
        return chain, function_key(value), "code"
    return _identity(chain, value) if callable(value) else None


def recorded(fn: Callable, reads: dict, watched: tuple) -> tuple:
    """The entries of the values a trace was seen to read (`jaxdist._state.record`:
    ``{chain: value}``) that ``watched`` does not hold already (at another chain to the
    same place), as `watch` makes them."""
    places = {place(fn, chain) for chain, _, _ in watched}
    out = []
    for chain, value in reads.items():
        entry = classify(chain, value)
        if entry is not None and place(fn, chain) not in places:
            out.append(entry)
    return tuple(out)


def place(fn: Callable, chain: Chain) -> Any:
    """Where ``chain`` ends, as ``(id of what holds it, key)``: two chains to one global,
    one through a function's globals and one through its module, are one place."""
    if not chain:
        return None
    try:
        parent = _chains.fetch(fn, chain[:-1])
    except _chains.Gone:
        return None
    kind, key = chain[-1]
    if kind == "global":
        return id(parent.__globals__), key
    if kind in ("attr", "getattr", "fattr"):
        held = _peek.instance_dict(parent)
        return (id(held) if held is not None and key in held else id(parent)), key
    return (id(parent), key) if kind == "item" else (id(parent), kind, key)


def _bounded(fn: Callable, out: list) -> tuple:
    """``out`` less the values compared on every call past `_MAX_WATCHED` (with a warning
    naming the first); those a barrier covers (`jaxdist._state.typed.owned`: a Keras
    layer's own data) are compared only after one moved, and are all kept."""
    owned, _ = _typed.owned(fn, tuple(out))
    per_call = [w for w, o in zip(out, owned) if not o]
    if len(per_call) <= _MAX_WATCHED:
        return tuple(out)
    warnings.warn(
        f"The step {getattr(fn, '__qualname__', fn)!r} reads more than {_MAX_WATCHED} "
        f"Python values from its state; {describe(fn, per_call[_MAX_WATCHED][0])} and "
        f"{len(per_call) - _MAX_WATCHED - 1} more keep the value they had when it was traced. "
        "Pass changing numbers to strategy.run as arguments.",
        RuntimeWarning,
        stacklevel=7,
    )
    dropped = {id(w) for w in per_call[_MAX_WATCHED:]}
    return tuple(w for w in out if id(w) not in dropped)


def _expect_trace(fn: Callable, out: list, walked: list, named: set[str]) -> None:
    """Asks the trace that may follow to record the code it runs (`jaxdist._state.ran`)
    where a watched value is reached by a name that code nested in the step's functions
    uses (a lambda given to ``jax.debug.callback``): `settle` then drops the values that
    only code which did not run reaches. Not where the code reads by computed names."""
    nested: set[str] = set()
    if _names.BY_NAME not in named:
        for value in (fn, *(v for _, v in walked)):
            f = value.__func__ if _peek.is_a(value, types.MethodType) else value
            if type(f) is types.FunctionType and _names.users_function(f):
                for c in f.__code__.co_consts:
                    if _peek.is_a(c, types.CodeType):
                        nested |= _ran.nested_names(c)
    if nested and any(_reads_by(fn, chain) & nested for chain, _, _ in out):
        _ran.expect(fn, named)
    else:
        _ran.forget(fn)


def _unread(fn: Callable, watched: list) -> list:
    """``watched`` less the values reached only by names that no code the trace ran
    uses, where nested code that did not run does (`_expect_trace`): a list a callback
    appends to when the program runs is not read by the trace."""
    record = _ran.take(fn)
    if record is None:
        return watched
    gone = _ran.unread(record.ran)
    if not gone:
        return watched
    named = set(record.named - gone)
    return [w for w in watched if _capture.is_named(w[0], named) and not _reads_by(fn, w[0]) & gone]


def _reads_by(fn: Callable, chain: Chain) -> set[str]:
    """The names ``chain`` reads by: attributes and globals, and closure variables
    (`jaxdist._state.ran.cell_names`)."""
    return _capture.chain_names(chain) | _ran.cell_names(fn, chain)


def _absent_globals(fn: Callable, walked: list) -> list[tuple[Chain, Any, str]]:
    """The globals the program's functions load that are not there now (``try: v = LR
    except NameError: ...``, ``globals().get``'s counterpart): defined later, the trace that
    found them absent does not fit."""
    out = []
    for chain, f in [((), fn), *walked]:
        if type(f) is types.FunctionType and _names.users_function(f):
            scope, builtin = f.__globals__, getattr(f, "__builtins__", {})
            for name in sorted(_names.global_names(f.__code__)):
                if name not in scope and name not in builtin:
                    out.append((chain, name, "noglobal"))
    return out


def _absent(chain: Chain, value: Any, probes: set[str]) -> list[tuple[Chain, Any, str]]:
    """The attributes the code may find absent (``hasattr(self, "acc")``, ``getattr(self,
    "bias", None)``: `jaxdist._state.names.probed`) that ``value``, an object of the
    program's own class, lacks now: set later, the trace that found them absent does not
    fit (TF's create-on-first-call idiom)."""
    cls = type(value)
    if not _names.users_class(cls) or _peek.type_lookup(cls, "__getattr__") is not None:
        return []
    own = _peek.instance_dict(value) or {}
    return [
        (chain, name, "absent")
        for name in sorted(probes)
        if name not in own and _peek.type_lookup(cls, name) is None
    ]


def _warn_opaque(fn: Callable, chains: list) -> None:
    """Warns naming the proxies and thread-locals the step reaches by names it uses:
    what it reads through them is a constant of the trace (reading them would run code)."""
    if not chains:
        return
    where = ", ".join(
        f"{describe(fn, c)} ({type(_chains.fetch(fn, c)).__name__})" for c in chains[:3]
    )
    warnings.warn(
        f"The step {getattr(fn, '__qualname__', fn)!r} reaches {where}: jaxdist cannot look "
        "through a weakref.proxy or a threading.local without running code, so the arrays "
        "and numbers the step reads through it keep the values they had when it was "
        "traced. Keep the state itself on the object (or a weakref.ref, which is read), or "
        "pass it to strategy.run as an argument.",
        RuntimeWarning,
        stacklevel=6,
    )


def by_identity(cls: type) -> bool:
    """Whether `watch` compares the objects of ``cls`` by identity, not by class: a class
    whose ``__jaxdist_identity__`` is true says so. A trace is of one strategy (its
    replicas, its devices), so a global ``strategy`` rebound to another one, of the same
    class, is a new trace.

    >>> class Topology:
    ...     __jaxdist_identity__ = True
    >>> held = {"t": Topology()}
    >>> step = lambda x: (held["t"], x)[1]
    >>> seen = watch(step)
    >>> held["t"] = Topology()
    >>> by_identity(Topology), changed(step, seen)
    (True, True)
    """
    found = _IDENTIFIED.get(cls)
    if found is None:
        found = _IDENTIFIED[cls] = bool(_peek.type_lookup(cls, "__jaxdist_identity__"))
    return found


_IDENTIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # `by_identity`'s answers


def _identity(chain: Chain, value: Any) -> tuple[Chain, Any, str]:
    """A callable watched by identity, held weakly where it can be (a jitted bound
    method of the step's object, ``self.act = jax.jit(self._act)``, would keep the
    object alive through the compile cache)."""
    try:
        return chain, weakref.ref(value), "weak"
    except TypeError:
        return chain, value, "ident"


def _library_values(libraries: list, named: set[str]) -> list:
    """The numbers and strings of a library's module that the code names (``pkg.LR``): the
    walk does not look into such modules (their arrays are no step's state), but a
    setting the program changes there between calls is read afresh."""
    out = []
    for chain, module in libraries:
        held = module.__dict__
        for name in sorted(named & held.keys()):
            if type(held[name]) in _EXACT:
                out.append(((*chain, ("attr", name)), held[name], "value"))
    return out


def _by_name(fn: Callable, watched: tuple[Chain, Any, str], named: set[str]) -> bool:
    """A number, string or None in attributes (at any depth) of objects of the
    program's own classes reached through names the code uses: code that reads
    attributes by computed names (``getattr(t, name)``, ``name`` from anywhere) may
    read it. (A library's objects, a Keras model's layers, are read by their names.)"""
    chain, value, how = watched
    n = len(chain)
    while n and chain[n - 1][0] in ("attr", "getattr"):
        n -= 1
    if how != "value" or n == len(chain) or not _capture.is_named(chain[:n], named):
        return False
    try:
        owners = [_chains.fetch(fn, chain[:i]) for i in range(n, len(chain))]
    except _chains.Gone:
        return False
    return all(_names.users_class(type(o)) for o in owners)


def _tree_def(value: Any) -> Any:
    """The structure of a registered pytree node (None for a leaf): a value written back
    as a new object of the same structure (``self.params`` after an update) is the same
    to a trace; its arrays are inputs."""
    leaf = (jax.Array, np.ndarray, Iterator, types.FunctionType, types.BuiltinFunctionType)
    if _peek.is_a(value, (*leaf, *WATCHED_SCALARS)):
        return None  # (generators and iterators are leaves: JAX warns on them)
    try:
        kids, treedef = jax.tree_util.tree_flatten(value, is_leaf=lambda x: x is not value)
    except Exception:  # noqa: BLE001 - a node whose flatten fails is compared otherwise
        return None
    return None if len(kids) == 1 and kids[0] is value else treedef


WATCHED_SCALARS = _reach.WATCHED  # (compared by value; one home, with what a class holds)


def _plain_callable(value: Any) -> bool:
    """A function, method, partial or other callable that is not a user object."""
    if _peek.is_a(value, (types.FunctionType, types.MethodType, functools.partial)):
        return True
    defined = [c.__dict__["__call__"] for c in type(value).__mro__ if "__call__" in c.__dict__]
    return callable(value) and not (defined and _peek.is_a(defined[0], types.FunctionType))


def _code_strings(fn: Callable) -> set:
    code = _chains.code_of(fn)
    return set() if code is None else {c for c in code.co_consts if _peek.is_a(c, str)}


_PARTS = (
    jax.Array,
    np.ndarray,
    list,
    tuple,
    dict,
    type,
    types.ModuleType,
    types.MethodType,  # its function and object are watched (a new bound method each
    functools.partial,  # ``self.f = self.g`` is the same), a partial's function and arguments
)
_EXACT = frozenset((bool, int, float, complex, str, type(None)))  # not subclasses: no __eq__
_NUMBERS = frozenset((decimal.Decimal, fractions.Fraction))  # the standard library's: its ==
_MAX_WATCHED = 4096  # about 2 ms a call to check (`Checker`), past it a warning
# numbers first in the bound
_ORDER = {
    "value": 0,
    "member": 0,
    "set": 0,
    "absent": 0,
    "noglobal": 0,
    "size": 1,
    "ident": 2,
    "weak": 2,
    "code": 2,
    "tree": 3,
    "type": 3,
}


def changed(fn: Callable, watched: tuple[tuple[Chain, Any, str], ...]) -> bool:
    """Whether a value recorded by `watch` is no longer the same."""
    return Checker(watched).changed(fn)


class Checker:
    """`changed` for one recorded set, checked on every call: the chains read as a tree
    (`jaxdist._state.chains.tree`), so that each object on the way is read once (a Keras
    model's step watches a thousand values under a few dozen objects), compiled into one
    Python function with each value's comparison where its chain ends
    (`jaxdist._state.chains.compile_walk`): the first that differs returns."""

    def __init__(self, watched: tuple[tuple[Chain, Any, str], ...]) -> None:
        names: dict[str, Any] = {"size": size, "SIZED": _SIZED, "SETNE": frozenset.__ne__}
        names["FUNCTION"] = types.FunctionType
        self._code: list[tuple[Chain, KeyWatch]] = []  # the functions watched by their key
        hows = [how for _, _, how in watched]
        for i, (_, value, how) in enumerate(watched):
            names[f"r{i}"], names[f"d{i}"] = value, _DIFFERS.get(how, _differs_value)
            if how == "code":  # (its key kept while the function and its captures are)
                self._code.append((watched[i][0], KeyWatch(value)))
                names[f"d{i}"] = self._code[-1][1]

        def end(ends: list[int], o: str) -> list[str]:
            return [f"if {_TESTS.get(hows[i], _TEST).format(o=o, i=i)}: return True" for i in ends]

        tree = _chains.tree([chain for chain, _, _ in watched])
        self._changed = _chains.compile_walk(tree, end, "False", [], names)

    def changed(self, fn: Callable) -> bool:
        try:
            return self._changed(fn)
        except _chains.Gone:
            return True

    def rewrite(self, fn: Callable) -> None:
        """Takes the keys of the functions watched, as ``fn``'s state holds them now, as
        written by its step (a capture it assigned, `jaxdist._state.keys.KeyWatch.rewrite`)."""
        for chain, watch in self._code:
            try:
                watch.rewrite(_chains.fetch(fn, chain))
            except _chains.Gone:
                continue


def differs(now: Any, value: Any, how: str) -> bool:
    """Whether ``now`` is no longer what `watch` recorded as ``value`` (compared ``how``)."""
    return _DIFFERS.get(how, _differs_value)(now, value)


def _differs_noglobal(now: Any, name: str) -> bool:
    return name in getattr(now, "__globals__", {})


def _differs_absent(now: Any, name: str) -> bool:
    own = _peek.instance_dict(now)
    return (own is not None and name in own) or _peek.type_lookup(type(now), name) is not None


def _differs_type(now: Any, value: Any) -> bool:
    return type(now) is not value


def _differs_tree(now: Any, value: Any) -> bool:
    tree = _tree_def(now)  # (a PyTreeDef compares only with another: nanobind's __ne__)
    return type(tree) is not type(value) or tree != value


def _differs_code(now: Any, value: Any) -> bool:
    if type(now) is not types.FunctionType:
        return True
    if now.__closure__ is None and now.__defaults__ is None:  # its key, without building it
        return value != (now.__code__, id(now.__globals__), ())
    return function_key(now) != value


def _differs_size(now: Any, value: Any) -> bool:
    return size(now) != value


def _differs_weak(now: Any, value: Any) -> bool:
    # a dead reference: the object it was is gone, so changed
    return now is not value and value() is not now


def _differs_ident(now: Any, value: Any) -> bool:
    return now is not value


def _differs_set(now: Any, value: Any) -> bool:
    # the same type, and equal as sets (its elements were hashed when added: no user
    # code runs for the copy's elements, which are the same objects)
    return type(now) is not value[0] or frozenset.__ne__(value[1], now)


def _differs_value(now: Any, value: Any) -> bool:
    return now is not value and (type(now) is not type(value) or not _equal(now, value))


_DIFFERS: dict[str, Callable[[Any, Any], bool]] = {
    "type": _differs_type,
    "tree": _differs_tree,
    "code": _differs_code,
    "size": _differs_size,
    "weak": _differs_weak,
    "ident": _differs_ident,
    "member": _differs_ident,
    "set": _differs_set,
    "value": _differs_value,
    "absent": _differs_absent,
    "noglobal": _differs_noglobal,
}
# the compiled check of each kind (`Checker`): ``{o}`` the value now, ``r{i}`` the one
# recorded, ``d{i}`` its kind's comparison; a built-in list's, dict's or tuple's size read
# in place, an identical value not compared further, a set compared by frozenset's own
# comparison (a subclass's ``__ne__`` is not called)
_SIZED = (list, dict, tuple)
_TEST = "{o} is not r{i} and d{i}({o}, r{i})"
_TESTS = {
    "type": "type({o}) is not r{i}",
    "size": "(len({o}) if type({o}) in SIZED else size({o})) != r{i}",
    # (a function: the key kept for it, `KeyWatch.held`, read in place; else built)
    "code": "type({o}) is not FUNCTION or (d{i}.held is None or not d{i}.held({o}))"
    " and d{i}.built_differs({o})",
    "tree": "d{i}({o}, r{i})",
    "absent": "d{i}({o}, r{i})",
    "noglobal": "d{i}({o}, r{i})",
    "member": "{o} is not r{i}",
    "set": "type({o}) is not r{i}[0] or SETNE(r{i}[1], {o})",
}


def moved_numbers(fn: Callable, watched: tuple[tuple[Chain, Any, str], ...]) -> list[Chain]:
    """The chains of the numbers recorded by `watch` (Python ints and floats, NumPy
    floats: `jaxdist._state.promote.is_number`) that now hold another number (a
    schedule the host sets, a counter the step increments)."""
    out = []
    for chain, value, how in watched:
        if how != "value" or not is_number(value):
            continue
        try:
            now = _chains.fetch(fn, chain)
        except _chains.Gone:
            continue
        if is_number(now) and not _equal(now, value):
            out.append(chain)
    # a container's numbers move together (a deque shifted by an append, a table
    # refilled): its other numbers are inputs too, not one trace more each
    moved = {c[:-1] for c in out if c[-1][0] == "item"}
    for chain, value, how in watched if moved else ():
        if how == "value" and is_number(value) and chain[-1][0] == "item":
            if chain[:-1] in moved and chain not in out:
                out.append(chain)
    return out


def settle(fn: Callable, watched: tuple[tuple[Chain, Any, str], ...]) -> tuple:
    """``watched`` (recorded before the trace) less the sizes the trace changed: a list
    the step appends to (``traces.append(1)``, a log) is its output, not an input, so
    its growth does not trace it again; a number it changes (``self.calls += 1``) does,
    as TF eager counts. Less, too, what the trace did not read: the values reached only
    by names of code nested in the step that did not run during the trace (a callback's
    lambda, `jaxdist._state.ran`), where the trace recorded the code it ran."""
    return tuple(_unread(fn, list(unchanged_sizes(fn, watched))))


def unchanged_sizes(fn: Callable, watched: tuple) -> tuple:
    """``watched`` less the sizes that changed since they were recorded (`settle`'s
    first rule: what the trace appended to is its output)."""
    out = []
    for chain, value, how in watched:
        if how == "size":
            try:
                if size(_chains.fetch(fn, chain)) != value:
                    continue
            except _chains.Gone:
                continue
        out.append((chain, value, how))
    return tuple(out)


def size(x: Any) -> Any:
    """How many entries a list, tuple, deque or dict has (a partial: its arguments),
    None otherwise."""
    kind = type(x)
    if kind is list or kind is dict or kind is tuple:  # the built-ins themselves: their length
        return len(x)
    if _peek.is_a(x, functools.partial):
        return (len(x.args), len(x.keywords))
    if _peek.is_a(x, tuple):
        return tuple.__len__(x)
    if _peek.is_a(x, collections.deque):
        return collections.deque.__len__(x)
    if _peek.is_a(x, list):
        return list.__len__(x)  # the built-in's length, not a subclass's __len__
    return dict.__len__(x) if _peek.is_a(x, dict) else None


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) or (a != a and b != b)  # NaN is its own value here
    except Exception:  # noqa: BLE001 - a value that cannot be compared counts as changed
        return False
