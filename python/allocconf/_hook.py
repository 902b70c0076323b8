"""Run a callback the moment ``import torch`` finishes.

A ``sys.meta_path`` finder that, for ``torch`` only, lets the other finders
find the module and wraps its loader, so that the callback runs right
after torch's module body has executed: in whichever thread imports torch,
through ``import torch`` or ``importlib.import_module``.  It fires once and
removes itself; if torch's import fails, it stays for the next attempt.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs import time; only checkers need it
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any, Callable, Optional, Sequence

    Callback = Callable[[ModuleType], None]


class TorchFinder:
    """The finder: placed first in ``sys.meta_path`` by :func:`install`."""

    _allocconf_finder = True

    def __init__(self, callback: Callback) -> None:
        self._callback = callback

    def find_spec(
        self,
        name: str,
        path: Optional[Sequence[str]] = None,
        target: Optional[ModuleType] = None,
    ) -> Optional[ModuleSpec]:
        if name != "torch":
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            # Another allocconf finder (left by a reload of this module)
            # would ask us back: skip them all, or the search recurses.
            if find is None or getattr(finder, "_allocconf_finder", False):
                continue
            spec: Optional[ModuleSpec] = find(name, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                # _Loader quacks like importlib.abc.Loader; subclassing it
                # would import importlib.abc on every `import allocconf`.
                spec.loader = _Loader(  # type: ignore[assignment]
                    spec.loader, self)
            return spec
        return None

    def fire(self, module: ModuleType) -> None:
        """Remove this finder, then hand the finished torch module over."""
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return  # already fired (a reload, or a second finder's copy)
        self._callback(module)


class _Loader:
    """torch's own loader, with the callback run after ``exec_module``."""

    def __init__(self, loader: Any, finder: TorchFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> Optional[ModuleType]:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            # torch keeps its real loader, whatever happens.
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
        self._finder.fire(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def install(callback: Callback) -> TorchFinder:
    """Put a finder that calls ``callback(torch)`` first in sys.meta_path;
    one already there (any copy of this module's) is replaced, so that
    there is never more than one."""
    sys.meta_path[:] = [
        f for f in sys.meta_path if not getattr(f, "_allocconf_finder", False)
    ]
    finder = TorchFinder(callback)
    sys.meta_path.insert(0, finder)
    return finder
