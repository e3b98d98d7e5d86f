"""A module imported on first use, declared once at the top of the module that uses it.

Every ``stalledpolicy`` command loads the three commands' modules to build its
parser, so a library one of them imports at module level is paid by all of
them, ``--help`` and a usage error included (redis-py: about 0.1 s). A module
that needs such a library in many functions binds it once::

    if TYPE_CHECKING:
        import redis
    else:
        redis = lazy_module("redis")  # deferred: <why>

and its functions use ``redis.Redis``, ``redis.exceptions.ResponseError``, as
after a plain import (the type checker reads the import). The first attribute
looked up imports the module; a submodule not yet imported (``redis.backoff``)
is imported when it is named. For third-party libraries only: a first-party
import deferred this way would be hidden from lint-imports (.importlinter).
"""

from __future__ import annotations

import importlib
from typing import Any


class _LazyModule:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._name)
        try:
            return getattr(module, attr)
        except AttributeError:
            pass
        try:
            return importlib.import_module(f"{self._name}.{attr}")  # a submodule not imported yet
        except ModuleNotFoundError:
            raise AttributeError(f"module {self._name!r} has no attribute {attr!r}") from None

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def lazy_module(name: str) -> Any:
    """A stand-in for the module ``name`` that imports it when an attribute is first looked up."""
    return _LazyModule(name)
