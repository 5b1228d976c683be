"""`jd.experimental.explain`: what jaxdist re-reads of a step's state on every call.

An eager step is traced once; each cached trace records where the step read its
state (`jaxdist._state.stage.Staged.state`): the arrays read afresh on every call, the
Python numbers that are inputs of the program (and those the step writes back), and
the values whose change traces the step again. This lists them, named as in the
step's source (``self.params['w']``).
"""

from __future__ import annotations

from collections.abc import Callable

from jaxdist._base.validate import describe
from jaxdist._program import compile as _compile
from jaxdist._state.stage import Staged

_HEADINGS = (
    ("arrays", "arrays read afresh on every call"),
    ("numbers", "Python numbers given to the program on every call"),
    ("written", "numbers the step writes, stored after every call"),
    ("checked", "values checked on every call (a change traces the step again)"),
)


def explain(fn: Callable) -> str:
    """What jaxdist re-reads of ``fn``'s state on each eager `Strategy.run` call, for
    each of its cached traces (newest first), as Python names it. ``fn`` may be a
    ``jd.function`` (its traces are listed).

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> class Trainer:
    ...     def __init__(self):
    ...         self.params, self.lr, self.calls = {"w": jnp.ones(())}, 0.5, 0
    ...     def step(self, x):
    ...         self.calls += 1
    ...         return x * self.params["w"] * self.lr
    >>> t, s = Trainer(), jd.OneDeviceStrategy("/cpu:0")
    >>> _ = s.run(t.step, args=(1.0,))
    >>> print(jd.experimental.explain(t.step))  # doctest: +NORMALIZE_WHITESPACE
    Trainer.step: 1 cached trace
    trace 1:
      arrays read afresh on every call: self.params['w']
      Python numbers given to the program on every call: self.calls
      numbers the step writes, stored after every call: self.calls (Python's arithmetic)
      values checked on every call (a change traces the step again): self.lr == 0.5,
    len(self.params) == 1, the step's function is code Trainer.step over the same captures,
    type(self) is Trainer

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"explain(fn) takes the function given to strategy.run; got {fn!r}.")
    fn = getattr(fn, "python_function", fn)  # a jd.function: the traces of what it wraps
    traces = [
        staged
        for entry in _compile.steps.entries(fn)
        for e in (entry if isinstance(entry, (tuple, list)) else (entry,))
        if isinstance(staged := getattr(e, "staged", e), Staged)
    ]
    plural = "" if len(traces) == 1 else "s"
    lines = [f"{describe(fn)}: {len(traces)} cached trace{plural}"]
    for k, staged in enumerate(traces, 1):
        lines.append(f"trace {k}:")
        state = staged.state(fn)
        for key, heading in _HEADINGS:
            if state[key]:
                lines.append(f"  {heading}: {', '.join(state[key])}")
        if not any(state.values()):
            lines.append("  nothing of its state")
    return "\n".join(lines)
