"""The Python frames a trace runs, seen through one profile function shared by its readers.

A trace runs the program's Python once. Two readers want the frames it enters: the code
it ran (`jaxdist._state.ran`: names only code that did not run uses are not inputs) and
the globals the program's functions read there (`jaxdist._state.record`). Python has one
profile function per thread, so this module owns it while any reader listens: `listen`
adds a reader (a function called with each frame the thread enters), `stop` removes it,
and tells whether every frame since was seen (another profiler, a debugger's or
cProfile's, set meanwhile means not). Where another profiler is set already, `listen`
gives None: the trace is not followed, and each reader does without.

>>> seen = []
>>> token = listen(lambda frame: seen.append(frame.f_code.co_name))
>>> def helper():
...     return 1
>>> helper()
1
>>> stop(token), "helper" in seen
(True, True)
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable
from typing import Any

Reader = Callable[[types.FrameType], None]


class _Listening:
    """One thread's readers and the profile function that calls them."""

    def __init__(self) -> None:
        self.readers: list[Reader] = []
        readers = self.readers

        def profile(frame: types.FrameType, event: str, arg: Any) -> None:
            if event == "call":
                for read in readers:
                    read(frame)

        self.profile = profile
        self.broken = False  # another profile function was set while readers listened


_local = threading.local()


def listen(reader: Reader) -> tuple[_Listening, Reader] | None:
    """Calls ``reader`` with each Python frame this thread enters until `stop`; None where
    another profile function is set (the frames cannot be followed)."""
    state: _Listening | None = getattr(_local, "state", None)
    current = sys.getprofile()
    if state is None or current is not state.profile:
        if current is not None:
            return None
        state = _local.state = _Listening()
        sys.setprofile(state.profile)
    state.readers.append(reader)
    return state, reader


def stop(token: tuple[_Listening, Reader] | None) -> bool:
    """Ends `listen`'s reading; whether every frame since was seen (False for None)."""
    if token is None:
        return False
    state, reader = token
    complete = sys.getprofile() is state.profile and not state.broken
    if not complete:
        state.broken = True
    if reader in state.readers:
        state.readers.remove(reader)
    if not state.readers:
        if sys.getprofile() is state.profile:
            sys.setprofile(None)
        if getattr(_local, "state", None) is state:
            _local.state = None
    return complete
