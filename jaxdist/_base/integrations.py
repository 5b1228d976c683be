"""Optional integrations that ``strategy.scope()`` enters, loaded only when their library is in use.

jaxdist never imports an optional library itself: `import jaxdist` must not import
Keras. An integration is one top-layer module, named here by the library whose
presence turns it on. When a scope is entered and that library is already imported
(``"keras" in sys.modules``), the integration module is imported by name (the one
lazy import in the package, which is why it is a string: a layer-0 module cannot
import the top layer) and its ``enter_scope(strategy)`` context manager is entered
for the length of the scope. Without the library nothing is imported and the
scope costs one dictionary lookup per integration.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any

INTEGRATIONS: dict[str, str] = {"keras": "jaxdist._keras.distribution"}
"""Library module name -> the jaxdist module that integrates it."""


def enter_scope(strategy: Any) -> contextlib.ExitStack:
    """Enters every active integration's scope for ``strategy``; the stack exits them.

    >>> import jaxdist as jd
    >>> from jaxdist._base import integrations as _integrations
    >>> _integrations.INTEGRATIONS
    {'keras': 'jaxdist._keras.distribution'}
    >>> with _integrations.enter_scope(jd.MirroredStrategy(["/cpu:0"])):  # what scope() does
    ...     pass
    """
    stack = contextlib.ExitStack()
    for library, module in INTEGRATIONS.items():
        if library in sys.modules:
            integration = importlib.import_module(module)
            try:
                stack.enter_context(integration.enter_scope(strategy))
            except BaseException:
                stack.close()
                raise
    return stack
