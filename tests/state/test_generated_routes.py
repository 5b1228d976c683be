"""A generated suite of stale-state holes (issue 46, item 3): every meaningful combination
of four axes, each run as a small program and checked against plain Python's answer.

The axes:

- **route**, how the step reaches the value: an attribute of ``self`` (``attr``), a dict
  item (``dict``), a module global (``global``), a closure cell (``cell``), a default
  argument (``default``), a method called through ``self`` (``method``), a base class's
  method through ``super()`` (``super``), a method under a ``functools.wraps`` decorator
  (``wraps``), a nested `jd.function` (``nested``), an object passed as an argument
  (``argobj``);
- **kind** of the value (`KINDS`): a jax array, a Python int and float, NumPy float64 and
  float32 scalars, a bool, an Enum member and a str (each picks a branch), a tuple and a
  namedtuple, a set (membership picks a branch), a list, a registered and
  an unregistered dataclass, a dict;
- **change** between calls: ``rebind`` (a new value), ``inplace`` (mutated, for mutable
  kinds), ``grow`` (list/dict/set), ``create`` (absent at the first call), ``delete``
  (deleted, then created again), ``thread`` (another thread rebinds or mutates it just
  before the call);
- **call**: ``eager`` (``strategy.run``), ``function`` (`jd.function` around
  ``strategy.run`` and ``strategy.reduce``), ``assign`` (that `jd.function` also assigns
  a new value through the same route: written back as plain Python would), ``jit``
  (``strategy.run`` inside a plain ``jax.jit``: the value is baked into the jitted
  function, so the right answer or a warning naming ``state_w`` is accepted).

Each combination is generated as Python source (`program`, printed in a failure), built
with its own globals, and called 3 times with the state changed before calls 2 and 3.

**Expected values** come from a model of the state kept with plain Python and NumPy only:
each kind makes its values twice, once for the program (jax arrays) and once for the
model (NumPy arrays), and the same change (or, for ``assign``, the same ``UPDATE``) is
applied to both. A step returns ``USE(value, total(x))`` (``total(x)`` if the value is
absent); the model's answer is ``USE(model, 8.0)`` (the all-reduced batch sum is 8 on
every strategy), times the replica count for ``strategy.reduce("SUM")``. After every
call the program's state must equal the model's (no tracer left in it), and the traces
(``jd.experimental.step_count`` eagerly, ``experimental_get_tracing_count`` under
`jd.function`) may not exceed the distinct static signatures the calls saw, plus one for
numbers' first change: a number or array that changes keeps 1-2 traces.

An outcome is accepted when it is right, or an error (RuntimeError/TypeError/ValueError)
or a warning names ``state_w`` (the value's place). Combinations failing from known
jaxdist bugs are listed in `KNOWN` (with why); one that passes is reported as a warning (a
few depend on the order the tests run in), so the list can be kept honest.
"""

import collections
import dataclasses
import enum
import functools
import textwrap
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored, ones_batch, total

import jaxdist as jd

# -- kinds ------------------------------------------------------------------------------


class Phase(enum.Enum):
    TRAIN = 1
    EVAL = 2


Pair = collections.namedtuple("Pair", "a b")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RegDC:
    a: jax.Array
    b: float


@dataclasses.dataclass
class PlainDC:
    a: float
    b: int


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    make: object  # make(i, xp): the i-th value (xp: jnp for the program, np for the model)
    use: object  # use(v, t): the step's result from the value and total(x)
    update: object  # update(v): the value an ``assign`` call writes back
    static: bool = False  # the value itself is part of the trace (a branch, a membership)
    mutate: object = None  # mutate(v, i): changes v in place
    grow: object = None  # grow(v, i): adds to v in place


def _arr(i, xp):
    return xp.asarray([[1.0, 2.0], [3.0, -1.0], [0.5, 4.0], [-2.0, 0.25]][i % 4], xp.float32)


def _set_mutate(v, i):
    if "a" in v:
        v.discard("a")
    else:
        v.add("a")


def _list_mutate(v, i):
    v[0] = float(i) + 0.5


def _dc_mutate(v, i):
    v.a = v.a * 2.0 + 1.0


def _regdc_mutate(v, i):
    v.b = float(i) - 0.5


def _dict_mutate(v, i):
    v["a"] = float(i) * 1.5


def _phase_use(v, t):
    return t * 2.0 if v is Phase.TRAIN else t - 1.0


KINDS = {
    k.name: k
    for k in [
        Kind(
            "array",
            make=_arr,
            use=lambda v, t: v[0] * t + v[1],
            update=lambda v: v * 2.0 + 1.0,
        ),
        Kind(
            "int",
            make=lambda i, xp: [1, 3, -2, 5][i % 4],
            use=lambda v, t: v * t + v,
            update=lambda v: v + 1,
        ),
        Kind(
            "float",
            make=lambda i, xp: [0.5, 1.5, -0.25, 3.0][i % 4],
            use=lambda v, t: v * t,
            update=lambda v: v * 0.5 + 1.0,
        ),
        Kind(
            "np_float64",
            make=lambda i, xp: np.float64([0.5, 1.5, -0.25, 3.0][i % 4]),
            use=lambda v, t: v * t,
            update=lambda v: v * 0.5 + 1.0,
        ),
        Kind(
            "np_float32",
            make=lambda i, xp: np.float32([0.5, 1.5, -0.25, 3.0][i % 4]),
            use=lambda v, t: v * t,
            update=lambda v: v * 0.5 + 1.0,
        ),
        Kind(
            "bool",
            make=lambda i, xp: i % 2 == 0,
            use=lambda v, t: t * 2.0 if v else t - 1.0,
            update=lambda v: not v,
            static=True,
        ),
        Kind(
            "enum",
            make=lambda i, xp: [Phase.TRAIN, Phase.EVAL][i % 2],
            use=_phase_use,
            update=lambda v: Phase.EVAL if v is Phase.TRAIN else Phase.TRAIN,
            static=True,
        ),
        Kind(
            "str",
            make=lambda i, xp: ["double", "minus"][i % 2],
            use=lambda v, t: t * 2.0 if v == "double" else t - 1.0,
            update=lambda v: "minus" if v == "double" else "double",
            static=True,
        ),
        Kind(
            "tuple",
            make=lambda i, xp: [(1.0, 2), (3.0, -1), (0.5, 4), (-2.0, 1)][i % 4],
            use=lambda v, t: v[0] * t + v[1],
            update=lambda v: (v[0] + 1.0, v[1]),
        ),
        Kind(
            "namedtuple",
            make=lambda i, xp: Pair(*[(1.0, 2.0), (3.0, -1.0), (0.5, 4.0), (-2.0, 1.0)][i % 4]),
            use=lambda v, t: v.a * t + v.b,
            update=lambda v: type(v)(v.a * 2.0, v.b),
        ),
        Kind(
            "set",
            make=lambda i, xp: [{"a"}, {"b"}, {"a", "b"}, set()][i % 4],
            use=lambda v, t: t * (2.0 if "a" in v else 1.0) + (10.0 if "b" in v else 0.0),
            update=lambda v: v ^ {"b"},
            static=True,
            mutate=_set_mutate,
            grow=lambda v, i: v.add(f"g{i}") or v.add("b"),
        ),
        Kind(
            "list",
            make=lambda i, xp: [[1.0, 2.0], [3.0], [0.5, 4.0, 1.0], [-2.0, 1.0]][i % 4],
            use=lambda v, t: v[0] * t + sum(v),
            update=lambda v: [v[0] + 1.0, *v[1:]],
            mutate=_list_mutate,
            grow=lambda v, i: v.append(float(i)),
        ),
        Kind(
            "regdc",
            make=lambda i, xp: RegDC(xp.asarray([1.0, 3.0, 0.5, -2.0][i % 4], xp.float32), 2.0),
            use=lambda v, t: v.a * t + v.b,
            update=lambda v: dataclasses.replace(v, a=v.a * 2.0),
            mutate=_regdc_mutate,
        ),
        Kind(
            "plaindc",
            make=lambda i, xp: PlainDC([1.0, 3.0, 0.5, -2.0][i % 4], i),
            use=lambda v, t: v.a * t + v.b,
            update=lambda v: dataclasses.replace(v, a=v.a * 2.0),
            mutate=_dc_mutate,
        ),
        Kind(
            "dict",
            make=lambda i, xp: {
                "a": [1.0, 3.0, 0.5, -2.0][i % 4],
                "w": xp.asarray(2.0, xp.float32),
            },
            use=lambda v, t: v["a"] * t + sum(v.values()),
            update=lambda v: {**v, "a": v["a"] + 1.0},
            mutate=_dict_mutate,
            grow=lambda v, i: v.__setitem__(f"g{i}", float(i)),
        ),
    ]
}

# -- routes: each the source of a program holding ``state_w`` -------------------------------
# A route's source defines STEP (given to strategy.run), EXTRA (its further args), SET,
# GET (None when absent) and DEL; `BUMPS` has what an ``assign`` call's jd.function adds
# to its body (a declaration, the assignment) and its parameters after x.


def _route_attr(absent):
    read = 'getattr(self, "state_w", None)' if absent else "self.state_w"
    return f"""
class M:
    def step(self, x):
        return OUT({read}, total(x))
m = M()
STEP, EXTRA = m.step, ()
def SET(v): m.state_w = v
def GET(): return getattr(m, "state_w", None)
def DEL(): del m.state_w
"""


def _route_dict(absent):
    read = 'D.get("state_w")' if absent else 'D["state_w"]'
    return f"""
D = {{}}
def step(x):
    return OUT({read}, total(x))
STEP, EXTRA = step, ()
def SET(v): D["state_w"] = v
def GET(): return D.get("state_w")
def DEL(): del D["state_w"]
"""


_TRY_READ = """
    try:
        v = state_w
    except NameError:
        v = None"""


def _route_global(absent):
    read = _TRY_READ if absent else "\n    v = state_w"
    return f"""
def step(x):{read}
    return OUT(v, total(x))
STEP, EXTRA = step, ()
def SET(v): G["state_w"] = v
def GET(): return G.get("state_w")
def DEL(): del G["state_w"]
"""


def _route_cell(absent):
    read = _TRY_READ if absent else "\n    v = state_w"
    return f"""
state_w = None
def step(x):{read}
    return OUT(v, total(x))
STEP, EXTRA = step, ()
def SET(v):
    nonlocal state_w
    state_w = v
def GET():
    try:
        return state_w
    except NameError:
        return None
def DEL():
    nonlocal state_w
    del state_w
"""


def _route_default(absent):
    return """
def step(x, state_w=None):
    return OUT(state_w, total(x))
STEP, EXTRA = step, ()
def SET(v): step.__defaults__ = (v,)
def GET(): return step.__defaults__[0]
"""


def _route_method(absent):
    read = 'getattr(self, "state_w", None)' if absent else "self.state_w"
    return f"""
class M:
    def read(self):
        return {read}
    def write(self, v):
        self.state_w = v
    def step(self, x):
        return OUT(self.read(), total(x))
m = M()
STEP, EXTRA = m.step, ()
def SET(v): m.state_w = v
def GET(): return getattr(m, "state_w", None)
def DEL(): del m.state_w
"""


def _route_super(absent):
    read = 'getattr(self, "state_w", None)' if absent else "self.state_w"
    return f"""
class B:
    def read(self):
        return {read}
    def write(self, v):
        self.state_w = v
class M(B):
    def read(self):
        return super().read()
    def write(self, v):
        super().write(v)
    def step(self, x):
        return OUT(self.read(), total(x))
m = M()
STEP, EXTRA = m.step, ()
def SET(v): m.state_w = v
def GET(): return getattr(m, "state_w", None)
def DEL(): del m.state_w
"""


def _route_wraps(absent):
    read = 'getattr(self, "state_w", None)' if absent else "self.state_w"
    return f"""
def deco(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper
class M:
    @deco
    def step(self, x):
        return OUT({read}, total(x))
    @deco
    def bump(self):
        self.state_w = UPDATE(self.state_w)
m = M()
STEP, EXTRA = m.step, ()
def SET(v): m.state_w = v
def GET(): return getattr(m, "state_w", None)
def DEL(): del m.state_w
"""


def _route_nested(absent):
    read = 'getattr(self, "state_w", None)' if absent else "self.state_w"
    return f"""
class M:
    @jd.function
    def inner(self, t):
        return OUT({read}, t)
    @jd.function
    def bump(self):
        self.state_w = UPDATE(self.state_w)
    def step(self, x):
        return self.inner(total(x))
m = M()
STEP, EXTRA = m.step, ()
def SET(v): m.state_w = v
def GET(): return getattr(m, "state_w", None)
def DEL(): del m.state_w
"""


def _route_argobj(absent):
    read = 'getattr(o, "state_w", None)' if absent else "o.state_w"
    return f"""
class O:
    pass
obj = O()
def step(x, o):
    return OUT({read}, total(x))
STEP, EXTRA = step, (obj,)
def SET(v): obj.state_w = v
def GET(): return getattr(obj, "state_w", None)
def DEL(): del obj.state_w
"""


BUMPS = {  # route: (declaration, assignment, parameters after x)
    "attr": ("", "m.state_w = UPDATE(m.state_w)", ""),
    "dict": ("", 'D["state_w"] = UPDATE(D["state_w"])', ""),
    "global": ("global state_w", "state_w = UPDATE(state_w)", ""),
    "cell": ("nonlocal state_w", "state_w = UPDATE(state_w)", ""),
    "default": ("", "", ""),
    "method": ("", "m.write(UPDATE(m.read()))", ""),
    "super": ("", "m.write(UPDATE(m.read()))", ""),
    "wraps": ("", "m.bump()", ""),
    "nested": ("", "m.bump()", ""),
    "argobj": ("", "o.state_w = UPDATE(o.state_w)", ", o"),
}

ROUTES = {
    "attr": _route_attr,
    "dict": _route_dict,
    "global": _route_global,
    "cell": _route_cell,
    "default": _route_default,
    "method": _route_method,
    "super": _route_super,
    "wraps": _route_wraps,
    "nested": _route_nested,
    "argobj": _route_argobj,
}

CALLS = {
    "eager": """
def CALL(x):
    return float(S.experimental_local_results(S.run(STEP, args=(x, *EXTRA)))[0])
def TRACES():
    return jd.experimental.step_count(STEP)
""",
    "function": """
@jd.function
def F(x{params}):
    return S.reduce("SUM", S.run(STEP, args=(x{params},)), axis=None)
def CALL(x):
    return float(F(x, *EXTRA))
def TRACES():
    return F.experimental_get_tracing_count()
""",
    "assign": """
@jd.function
def F(x{params}):
    {bump_decl}
    out = S.reduce("SUM", S.run(STEP, args=(x{params},)), axis=None)
    {bump}
    return out
def CALL(x):
    return float(F(x, *EXTRA))
def TRACES():
    return F.experimental_get_tracing_count()
""",
    "jit": """
J = jax.jit(lambda x: S.run(STEP, args=(x, *EXTRA)))
def CALL(x):
    return float(S.experimental_local_results(J(x))[0])
def TRACES():
    return 0
""",
}

PRELUDE = """
def OUT(v, t):
    return t if v is None else USE(v, t)
"""


def program(route, kind, change, call):
    """The source of one combination: ``build()`` returns its names."""
    absent = change in ("create", "delete")
    body = ROUTES[route](absent)
    decl, bump, params = BUMPS[route]
    call_src = CALLS[call].format(params=params, bump_decl=decl, bump=bump)
    inner = textwrap.indent(body + call_src, "    ")
    return f"{PRELUDE}\ndef build():\n{inner}\n    return locals()\n"


# -- the combinations ---------------------------------------------------------------------


def changes_of(kind, route):
    out = ["rebind", "thread"]
    if kind.mutate:
        out.append("inplace")
    if kind.grow:
        out.append("grow")
    if route != "default":
        out += ["create", "delete"]
    return out


def calls_of(kind, route, change):
    if change in ("thread", "create", "delete"):
        return ["eager"]
    out = ["eager", "function"]
    if route != "default" and change in ("rebind", "inplace", "grow"):
        out.append("assign")
    if change == "rebind" and route in ("attr", "global", "argobj"):
        out.append("jit")
    return out


def combos(route, kind_name, replicas):
    kind = KINDS[kind_name]
    for change in changes_of(kind, route):
        if replicas > 1 and change not in ("rebind", "inplace"):
            continue
        for call in calls_of(kind, route, change):
            if replicas > 1 and call == "jit":
                continue
            yield (route, kind_name, change, call, replicas)


def cid(combo):
    route, kind, change, call, replicas = combo
    return f"{route}-{kind}-{change}-{call}-r{replicas}"


# Which items run: every (route, kind) on one replica; a slice on 2 and 8 replicas.
ITEMS = [(r, k, 1) for r in ROUTES for k in KINDS]
ITEMS += [(r, k, 2) for r in ("attr", "global") for k in ("array", "int", "bool")]
ITEMS += [(r, k, 8) for r in ("attr",) for k in ("array", "float")]

# Known failures (jaxdist bugs, issue 46), grouped by cause; each must still fail.
KNOWN_IDS: dict[str, list[str]] = {}  # why: the combinations (cid) failing for it (none now)

KNOWN = {c: why for why, ids in KNOWN_IDS.items() for c in ids}


def known(c):
    return KNOWN.get(c)


# -- running one combination ------------------------------------------------------------

_STRATEGIES: dict[int, object] = {}
_KEEP: list = []  # every program stays alive: a freed globals dict's id is never reused


def strategy_of(n):
    if n not in _STRATEGIES:
        _STRATEGIES[n] = mirrored(n)
    return _STRATEGIES[n]


def is_tracer(v):
    return any(isinstance(leaf, jax.core.Tracer) for leaf in _leaves(v))


def _leaves(v):
    if isinstance(v, dict):
        return [x for e in v.values() for x in _leaves(e)]
    if isinstance(v, (list, tuple)):
        return [x for e in v for x in _leaves(e)]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [x for f in dataclasses.fields(v) for x in _leaves(getattr(v, f.name))]
    return [v]


def same(actual, model):
    """Whether the program's state equals the model's (numbers to float32 tolerance)."""
    if model is None or isinstance(model, (str, enum.Enum, set)):
        return type(actual) is type(model) and actual == model
    if isinstance(model, bool):
        return isinstance(actual, (bool, np.bool_)) and bool(actual) == model
    if isinstance(model, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == model.keys()
            and all(same(actual[k], model[k]) for k in model)
        )
    if isinstance(model, (list, tuple)):
        return (
            type(actual) is type(model)
            and len(actual) == len(model)
            and all(same(a, m) for a, m in zip(actual, model))
        )
    if dataclasses.is_dataclass(model):
        return type(actual) is type(model) and all(
            same(getattr(actual, f.name), getattr(model, f.name)) for f in dataclasses.fields(model)
        )
    try:
        a, m = np.asarray(actual, np.float64), np.asarray(model, np.float64)
    except Exception:  # noqa: BLE001 - anything not a number is not the same
        return False
    return a.shape == m.shape and np.allclose(a, m, rtol=1e-5, atol=1e-6)


def signature(v):
    """What of a model value is part of a trace (shapes and structure; the value itself for
    a static kind): the traces of a combination are bounded by its distinct signatures."""
    if v is None:
        return "absent"
    if isinstance(v, (bool, str, enum.Enum)):
        return repr(v)
    if isinstance(v, set):
        return repr(sorted(v))
    if isinstance(v, dict):
        return ("dict", tuple(v), tuple(signature(e) for e in v.values()))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(signature(e) for e in v))
    if dataclasses.is_dataclass(v):
        return (
            type(v).__name__,
            tuple(signature(getattr(v, f.name)) for f in dataclasses.fields(v)),
        )
    return (type(v).__name__, np.shape(v))


def plan(kind, change):
    """The operation before each of 3 calls: ("set", i), ("mutate", i), ("grow", i),
    ("del",), or None (unchanged); and whether it runs on another thread."""
    if change == "rebind":
        return [("set", 0), ("set", 1), ("set", 2)], False
    if change == "thread":
        op = "mutate" if kind.mutate else "set"
        return [("set", 0), (op, 1), (op, 2)], True
    if change == "inplace":
        return [("set", 0), ("mutate", 1), ("mutate", 2)], False
    if change == "grow":
        return [("set", 0), ("grow", 1), ("grow", 2)], False
    if change == "create":
        return [None, ("set", 1), ("set", 2)], False
    if change == "delete":
        return [("set", 0), ("del",), ("set", 1)], False
    raise ValueError(change)


def apply(op, kind, names, model):
    """Applies ``op`` to the program's state and returns the model's new value."""
    if op[0] == "set":
        names["SET"](kind.make(op[1], jnp))
        return kind.make(op[1], np)
    if op[0] == "del":
        names["DEL"]()
        return None
    fn = kind.mutate if op[0] == "mutate" else kind.grow
    fn(names["GET"](), op[1])
    fn(model, op[1])
    return model


class Failed(Exception):
    pass


def run_combo(combo):
    """None if the combination behaves as plain Python (or names ``state_w`` in an error or
    warning), else what went wrong."""
    route, kind_name, change, call, replicas = combo
    kind = KINDS[kind_name]
    s = strategy_of(replicas)
    x = ones_batch(s)
    src = program(route, kind_name, change, call)
    ns = {
        "jd": jd,
        "jax": jax,
        "jnp": jnp,
        "np": np,
        "functools": functools,
        "total": total,
        "S": s,
        "USE": kind.use,
        "UPDATE": kind.update,
    }
    ns["G"] = ns
    _KEEP.append(ns)
    ops, threaded = plan(kind, change)
    factor = replicas if call in ("function", "assign") else 1
    model, sigs, log = None, [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            filename = f"<generated {cid(combo)}>"  # (a class it makes says "builtins")
            exec(compile(src, filename, "exec"), ns)  # noqa: S102 - generated above
            names = ns["build"]()
            for i, op in enumerate(ops):
                if op is not None:
                    if threaded and i > 0:
                        box = []
                        th = threading.Thread(
                            target=lambda op=op, box=box, model=model: box.append(
                                apply(op, kind, names, model)
                            )
                        )
                        th.start()
                        th.join()
                        if not box:
                            raise Failed(f"call {i + 1}: the change on another thread failed")
                        model = box[0]
                    else:
                        model = apply(op, kind, names, model)
                sigs.append(signature(model))
                expected = factor * float(8.0 if model is None else kind.use(model, 8.0))
                got = names["CALL"](x)
                if call == "assign":
                    model = kind.update(model)
                state = names["GET"]()
                if is_tracer(state):
                    raise Failed(f"call {i + 1}: a tracer left in state_w: {state!r}")
                if not np.isclose(got, expected, rtol=1e-5, atol=1e-5):
                    raise Failed(
                        f"call {i + 1}: got {got}, plain Python gives {expected} (state_w={model!r})"
                    )
                if not same(state, model):
                    raise Failed(
                        f"call {i + 1}: state_w is {state!r} after the call, plain Python has {model!r}"
                    )
                log.append(got)
            traces = names["TRACES"]()
            bound = len(set(map(repr, sigs))) + (0 if kind.static else 1)
            if traces > bound:
                raise Failed(
                    f"{traces} traces over {len(ops)} calls (at most {bound}: signatures {sigs})"
                )
        except Failed as e:
            named = [w for w in caught if "state_w" in str(w.message)]
            if named:
                return None
            return f"{e}; warnings: {[str(w.message)[:160] for w in caught]}"
        except (RuntimeError, TypeError, ValueError) as e:
            if "state_w" in str(e):
                return None
            return f"{type(e).__name__} not naming state_w: {str(e)[:300]}"
        except Exception as e:  # noqa: BLE001 - an internal error is a failure
            return f"internal {type(e).__name__}: {str(e)[:300]}"
    return None


@pytest.mark.parametrize(
    ("route", "kind", "replicas"), ITEMS, ids=[f"{r}-{k}-r{n}" for r, k, n in ITEMS]
)
def test_generated_routes(route, kind, replicas):
    failures, passed_known, first = [], [], None
    for combo in combos(route, kind, replicas):
        c = cid(combo)
        why = known(c)
        problem = run_combo(combo)
        if problem and not why:
            failures.append(f"{c}: {problem}")
            first = first or combo
        elif why and not problem:
            passed_known.append(f"{c} (KNOWN: {why})")
    if failures:
        detail = program(*first[:4])
        pytest.fail(
            f"{len(failures)} combination(s) differ from plain Python:\n  "
            + "\n  ".join(failures)
            + f"\n(the program of {cid(first)}:\n{detail})"
        )
    if passed_known:  # (a warning, not a failure: a few pass or fail with the order of the tests)
        warnings.warn(
            "KNOWN failures that passed (remove them from KNOWN if they always do):\n  "
            + "\n  ".join(passed_known),
            stacklevel=1,
        )


def test_the_suite_covers_at_least_1000_combinations():
    n = sum(1 for item in ITEMS for _ in combos(*item))
    assert n >= 1000, n
