"""A chain from a step function to a value of its state, and reading it again.

`jaxdist._state.capture` finds, once per trace, where a step read each array of its
state: a chain of steps (``(kind, key)``: a closure cell, a global, an attribute, an
item, a pytree child, a view...) from the step function to the value. This module
reads a chain again, on every call: `fetch` one chain, `Fetcher` many as a tree (each
object on the way read once); `describe` names it as Python source reads it
(``self.model.params['w']``), for the messages that point at a place. It holds what a
chain step means (`_STEPS`, the one place that follows each kind), the NumPy views a
step takes of its state's arrays (where one lies in its array, `view_spec`; the same
view of the array there now), and the pytree children a ``child`` step reads
(`pytree_children`). It is apart from the
walk that finds the chains (`jaxdist._state.capture`) because everything that reads
state afresh (`jaxdist._state.watch`, `jaxdist._state.promote`, `jaxdist._state.assign`,
`jaxdist._state.stage`) needs the reading only.

>>> box = {"lr": 0.1}
>>> step = lambda x: x * box["lr"]
>>> chain = (("global", "box"), ("item", "lr"))
>>> fetch(step, chain)
0.1
>>> box["lr"] = 0.2
>>> Fetcher([chain, chain[:1]]).values(step)
[0.2, {'lr': 0.2}]
"""

from __future__ import annotations

import enum
import functools
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

import jax
import numpy as np

from jaxdist._state import names as _names
from jaxdist._state import peek as _peek

Chain = tuple  # ((kind, key), ...) from the step function to a value

Gone = _peek.Gone  # the value a chain led to is no longer there


def pytree_children(obj: Any) -> tuple[list, Any] | None:
    """The children of a registered pytree node (None for a leaf)."""
    if _peek.is_a(obj, Iterator):  # generators and iterators are leaves (JAX warns on them)
        return None
    kids, treedef = jax.tree_util.tree_flatten(obj, is_leaf=lambda x: x is not obj)
    if len(kids) == 1 and kids[0] is obj:
        return None
    return kids, treedef


def same_array(a: Any, b: Any) -> bool:
    """``a`` is ``b``, or both are NumPy arrays over the same memory, laid out alike."""
    return a is b or _same(a, b)


def _same(child: Any, target: Any) -> bool:
    if child is target:
        return True
    return (  # a NumPy view of all of ``child``, as it is laid out
        _peek.is_a(child, np.ndarray)
        and _peek.is_a(target, np.ndarray)
        and child.shape == target.shape
        and child.dtype == target.dtype
        and child.strides == target.strides
        and child.__array_interface__["data"][0] == target.__array_interface__["data"][0]
    )


def owner(x: np.ndarray) -> Any:
    while isinstance(x.base, np.ndarray):  # (NumPy arrays only: no user code)
        x = x.base
    return x.base if x.base is not None else x


def inside(view: Any, base: Any) -> bool:
    """Whether NumPy array ``view`` lies in the memory of NumPy array ``base``."""
    if not (_peek.is_a(view, np.ndarray) and _peek.is_a(base, np.ndarray)):
        return False
    low, high = _bounds(view)
    base_low, base_high = _bounds(base)
    return base_low <= low and high <= base_high and base.flags.c_contiguous


def _bounds(x: np.ndarray) -> tuple[int, int]:
    start = x.__array_interface__["data"][0]
    extents = [(n - 1) * s for n, s in zip(x.shape, x.strides)]
    low = start + sum(min(0, e) for e in extents)
    return low, start + sum(max(0, e) for e in extents) + x.itemsize


def view_spec(base: np.ndarray, view: np.ndarray) -> tuple:
    """Where ``view`` (``table[0]``, ``table.T`` taken in the step) lies in ``base``."""
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    layout = (base.shape, base.strides, base.dtype.str)
    return (offset, view.shape, view.strides, view.dtype.str, layout)


def _view(base: Any, spec: tuple) -> np.ndarray:
    """The same view of the array now at ``base``'s place (its new values too)."""
    offset, shape, strides, dtype, layout = spec
    if not _peek.is_a(base, np.ndarray) or (base.shape, base.strides, base.dtype.str) != layout:
        raise Gone("the array a view was taken of changed layout")
    return np.ndarray(shape, np.dtype(dtype), buffer=base, offset=offset, strides=strides)


class StepArguments(functools.partial):
    """A step with the objects of one call's arguments that can hold state: the root its
    state is walked from and read at (`jaxdist._state.arguments`). ``at``: each object's
    argument leaf index. Called, it is the step called with the arguments it is given."""

    at: tuple[int, ...] = ()
    named: Callable[[int], str] | None = None  # an argument leaf's name, as the call wrote it

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def label(self, k: int) -> str:
        """How a message names the ``k``-th object: as the step's parameter (``model``,
        ``batch['cfg']``), else by its leaf among the arguments."""
        at = self.at[k] if k < len(self.at) else k
        if self.named is not None:
            try:
                return self.named(at)
            except Exception:  # noqa: BLE001 - a signature that cannot be read: the leaf
                pass
        return f"argument leaf {at} ({type(self.args[k]).__name__})"


def step_of(fn: Callable) -> Callable:
    """The step function of a root (``fn`` itself when it is one)."""
    return fn.func if type(fn) is StepArguments else fn


def code_of(fn: Callable) -> types.CodeType | None:
    """The code of a root's step (a function's, a bound method's function's); None for a
    callable object (its attributes are not read: a ``__getattr__`` would run).

    >>> code_of(step_of).co_name, code_of(len)
    ('step_of', None)
    """
    fn = step_of(fn)
    fn = fn.__func__ if type(fn) is types.MethodType else fn
    return fn.__code__ if type(fn) is types.FunctionType else None


def fetch(fn: Callable, chain: Chain) -> Any:
    """The value at the end of ``chain`` now (raises `Gone` if it is not there)."""
    obj = fn
    try:
        for kind, key in chain:
            obj = _STEPS[kind](obj, key)
    except Gone:
        raise
    except Exception as e:
        raise Gone(str(e)) from None
    return obj


def describe_safely(fn: Callable, chain: Chain) -> str:
    """`describe`, or the chain's steps where a step of it is gone now."""
    try:
        return describe(fn, chain)
    except Exception:  # noqa: BLE001 - an object of the chain is gone or changed
        return repr(chain)


def _name(obj: Any) -> str:
    """A function's, class's or module's ``__name__``; "fn" for anything else (a callable
    object's ``__getattr__`` is not asked)."""
    if type(obj) in (types.FunctionType, types.MethodType, types.ModuleType) or isinstance(
        obj, type
    ):
        return obj.__name__
    return "fn"


def describe(fn: Callable, chain: Chain) -> str:
    """``chain`` as Python source would read it (``self.model.params['w']``)."""
    out, obj = "", cast(Any, fn)
    for kind, key in chain:
        if kind == "self":
            out = "self"
        elif kind == "cell":
            out = obj.__code__.co_freevars[key]
        elif kind == "global":
            out = key
        elif kind == "parg" and type(obj) is StepArguments:
            out = obj.label(key)
        elif kind in ("default", "kwdefault", "parg", "pkw"):
            out = f"{'default' if 'default' in kind else 'partial'} argument {key!r}"
        elif kind in ("attr", "getattr", "fattr"):
            out = (out or _name(obj)) + f".{key}"
        elif kind == "meth":  # (a base's definition: what ``super()`` reaches)
            out = (out or _name(obj)) + f".{key[0]}" + " of a base" * key[1]
        elif kind == "wrapped":
            out = (out or _name(obj)) + ".__wrapped__"
        elif kind == "type":
            out = f"type({out or _name(obj)})"
        elif kind == "import":
            out = key
        elif kind == "item":
            out += f"[{key!r}]"
        elif kind == "child":
            out += f".{key[2]}" if key[2] else f"[{key[1]}]"
        try:  # (a value the chain goes through may be gone now: the name is still told)
            obj = fetch(obj, ((kind, key),)) if kind != "view" else obj
        except Gone:
            obj = None
    return out


class Fetcher:
    """`fetch` of many chains at once, as a tree: each object on the way is read once
    (10,000 parameters under ``self.params`` are 10,000 item reads, not 30,000 links).

    The tree is compiled into one Python function when the fetcher is made (`compile_walk`):
    it runs on every call of a step, so each link is one statement, with one ``try`` for
    the whole walk, rather than a recursive walk over the tree's dictionaries."""

    def __init__(self, chains: list) -> None:
        head = [f"out = [None] * {len(chains)}"]
        self._walk = compile_walk(tree(chains), _store, "out", head, {})

    def values(self, fn: Callable) -> list:
        """The value at the end of each chain now (raises `Gone` if one is not there)."""
        return self._walk(fn)


def _plain_key(key: Any) -> bool:
    """A key whose hash and equality run no code of the program (a built-in's)."""
    if type(key) is tuple:
        return all(_plain_key(k) for k in key)
    return type(key) in _PLAIN_KEYS or _peek.is_a(key, (enum.Enum, type))


_PLAIN_KEYS = frozenset((str, int, float, bool, bytes, complex, type(None), frozenset))


def item_by_identity(obj: Any, key: Any) -> Any:
    """``obj[key]`` for a mapping, the entry whose key *is* ``key`` found without hashing
    it (a key of the program's class: its ``__hash__`` is not run on every call)."""
    if _peek.is_a(obj, dict):
        for held, value in dict.items(obj):
            if held is key:
                return value
        raise Gone("the key is no longer in the mapping")
    return _peek.item(obj, key)


# links that are one attribute or item read: written into the compiled walk as they are
_INLINE = {
    "self": "{o}.__self__",
    "func": "{o}.__func__",
    "pfunc": "{o}.func",
    "global": "{o}.__globals__[{k}]",
    "cell": "{o}.__closure__[{k}].cell_contents",
    "fattr": "{o}.__dict__[{k}]",
    "default": "{o}.__defaults__[{k}]",
    # an instance attribute, and a built-in container's item, without a call each: what
    # the ``attr`` and ``item`` steps read (`_STEPS`), the common cases in place
    "attr": "(D({o}) or E)[{k}]",
    "item": "({o}[{k}] if (t := type({o})) is dict or t is list or t is tuple else I({o}, {k}))",
}
# the names the inline links use (`compile_walk`)
_INLINE_NAMES = {
    "D": _peek.instance_dict,
    "E": types.MappingProxyType({}),
    "I": _peek.item,
    "IK": item_by_identity,
}


def tree(chains: list) -> dict:
    """``chains`` as nested dicts of their links, the indices of the chains that end at
    a node under its key None (what `compile_walk` walks)."""
    root: dict = {}
    for i, chain in enumerate(chains):
        node = root
        for link in chain:
            node = node.setdefault(link, {})
        node.setdefault(None, []).append(i)
    return root


def _store(ends: list[int], here: str) -> list[str]:
    return [f"out[{i}] = {here}" for i in ends]


def compile_walk(
    root: dict,
    end: Callable[[list[int], str], list[str]],
    result: str,
    head: list[str],
    names: dict[str, Any],
) -> Callable[[Any], Any]:
    """One function walking the tree ``root`` (chains' links as nested dicts; the
    chains ending at a node listed under its key None) from its argument: each link's
    value in a local named by its depth (``o3``: the objects on the way are needed only
    below them), ``end(indices, local)``'s statements where chains end, and ``result``
    returned. A link that is missing raises `Gone`. Only fixed templates and numbers are
    written into its source; the links' keys and step functions are its globals, with
    ``names`` (what ``head`` and ``end`` use)."""
    names = {**names, **_INLINE_NAMES, "Gone": Gone}
    lines = list(head)
    _emit(root, 0, lines, names, end)
    body = "".join(f"        {line}\n" for line in lines[len(head) :]) or "        pass\n"
    source = (
        "def walk(o0):\n" + "".join(f"    {line}\n" for line in head) + f"    try:\n{body}"
        "    except Gone:\n        raise\n"
        "    except Exception as e:\n        raise Gone(str(e)) from None\n"
        f"    return {result}\n"
    )
    exec(compiled(source, "<jaxdist.state.chains.Fetcher>"), names)  # noqa: S102
    return names["walk"]


def compiled(source: str, filename: str) -> types.CodeType:
    """``compile(source, filename, "exec")``, the code kept by its source: each trace of a
    step generates its walks anew, and the traces of one step (its argument signatures,
    replica counts, a retrace) mostly generate the same source (a Keras model's watch is
    thousands of lines, tens of milliseconds to compile). The code holds no value: its
    names (`compile_walk`'s globals) are given to each ``exec``.

    >>> compiled("x = 1", "<s>") is compiled("x = 1", "<s>")
    True
    """
    key = (source, filename)
    code = _COMPILED.get(key)
    if code is None:
        code = compile(source, filename, "exec")
        if len(_COMPILED) >= _COMPILED_MAX:
            try:  # the oldest (another thread may be changing the table meanwhile)
                del _COMPILED[next(iter(_COMPILED))]
            except (StopIteration, RuntimeError, KeyError):
                pass
        _COMPILED[key] = code
    return code


_COMPILED: dict[tuple[str, str], types.CodeType] = {}
_COMPILED_MAX = 256


def _emit(node: dict, depth: int, lines: list, names: dict, end: Callable) -> None:
    here = f"o{depth}"
    for link, sub in node.items():
        if link is None:
            lines += end(sub, here)
            continue
        kind, key = link
        k = len(names)
        names[f"k{k}"] = key
        template = _INLINE.get(kind)
        if kind == "item" and not _plain_key(key):  # a key of the program's class: its
            template = "IK({o}, {k})"  # own ``__hash__`` and ``__eq__`` are not run
        if template is None:
            names[f"s{k}"] = _STEPS.get(kind, _unknown)
            template = f"s{k}({{o}}, {{k}})"
        lines.append(f"o{depth + 1} = " + template.format(o=here, k=f"k{k}"))
        _emit(sub, depth + 1, lines, names, end)


def _unknown(obj: Any, key: Any) -> Any:
    raise Gone("a link of an unknown kind")


def _gone() -> Any:
    raise Gone("the value changed type")


def method(obj: Any, key: tuple) -> Any:
    """The ``k``-th definition of the method ``name`` along the MRO of ``obj``'s class
    (of ``obj``, a class), ``key`` being ``(name, k)``, as the function it runs
    (`jaxdist._state.names.method_function`): no user code runs."""
    name, k = key
    for klass in (obj if _peek.is_a(obj, type) else type(obj)).__mro__:
        found = klass.__dict__.get(name, _NONE)
        if found is not _NONE:
            if not k:
                return _names.method_function(found)
            k -= 1
    raise Gone(f"no method {name}")


_NONE = object()


def _wrapped(obj: Any, key: None) -> Any:
    found = _names.wrapped(obj)
    if found is None:
        raise Gone("no __wrapped__")
    return found


def _child(obj: Any, key: tuple) -> Any:
    node = pytree_children(obj)
    if node is None or node[1] != key[0]:
        raise Gone("pytree structure changed")
    return node[0][key[1]]


_STEPS: dict[str, Callable[[Any, Any], Any]] = {
    "self": lambda o, k: o.__self__,
    "local": lambda o, k: o.__jaxdist_local__(),
    "func": lambda o, k: o.__func__,
    "pfunc": lambda o, k: o.func,
    "parg": lambda o, k: o.args[k],
    "pkw": lambda o, k: o.keywords[k],
    "cell": lambda o, k: o.__closure__[k].cell_contents,
    "global": lambda o, k: o.__globals__[k],
    "item": lambda o, k: _peek.item(o, k) if _plain_key(k) else item_by_identity(o, k),
    "attr": lambda o, k: (_peek.instance_dict(o) or {})[k],
    "getattr": lambda o, k: _peek.safe_getattr(o, k),
    "import": lambda o, k: sys.modules[k],
    "type": lambda o, k: type(o),
    "fattr": lambda o, k: o.__dict__[k],
    "deref": lambda o, k: o() if type(o) is weakref.ref else _gone(),
    "flat": lambda o, k: o.ravel()[k] if _peek.is_a(o, np.ndarray) else _gone(),
    "stacked": lambda o, k: _child(o, k),
    "default": lambda o, k: o.__defaults__[k],
    "kwdefault": lambda o, k: o.__kwdefaults__[k],
    "child": _child,
    "view": _view,
    "meth": method,
    "wrapped": _wrapped,
}
