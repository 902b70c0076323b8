"""Run a callback the moment ``import torch`` (or a neighbour's import)
finishes.

A ``sys.meta_path`` finder that, for the names it watches only, lets the
other finders find the module and wraps its loader, so that the callback
runs right after the module body has executed: in whichever thread imports
it, through ``import`` or ``importlib.import_module``; a spec that is only
looked up (``importlib.util.find_spec``) fires nothing.  Each name fires
once; the finder removes itself when none is left.  If an import fails,
its name stays watched for the next attempt.

A module already in ``sys.modules`` but still being imported (allocconf
imported by another thread, or by torch's own import chain, while ``import
torch`` runs) asks no finder again: :meth:`TorchFinder.wait` fires for it
from a thread of its own once that import completes, without importing
anything itself.

Two finders: :class:`TorchFinder` for torch (gone once torch is imported)
and :class:`NeighbourFinder` for the neighbours of allocconf/_neighbours.py.
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
    """The finder for torch: placed first in ``sys.meta_path`` by
    :func:`install`."""

    _allocconf_finder = True

    def __init__(self, callback: Callback,
                 names: Sequence[str] = ("torch",)) -> None:
        self._callbacks = {name: callback for name in names}

    def find_spec(
        self,
        name: str,
        path: Optional[Sequence[str]] = None,
        target: Optional[ModuleType] = None,
    ) -> Optional[ModuleSpec]:
        if name not in self._callbacks:
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
                    spec.loader, self, name)
            return spec
        return None

    def wait(self, name: str) -> None:
        """Fire for `name`, which is in ``sys.modules`` but still being
        imported, once that import completes: from a daemon thread that
        waits on the import's own module lock.  If the import fails, the
        finder stays, for the next attempt."""
        import threading

        threading.Thread(target=self._wait, args=(name,), daemon=True,
                         name=f"allocconf: waiting for import {name}").start()

    def _wait(self, name: str) -> None:
        lock = _module_lock(name)
        if lock is not None:
            try:
                # Held by the importing thread until the module's body has
                # run (importlib's _find_and_load, Python 3.9 to 3.13).
                lock.acquire()
                lock.release()
            except Exception:
                lock = None
        while True:
            module = sys.modules.get(name)
            if module is None:
                return  # the import failed: the finder sees the next one
            if not initializing(module):
                self.fire(name, module)
                return
            import time

            time.sleep(0.01)  # no module lock to wait on: poll

    def fire(self, name: str, module: ModuleType) -> None:
        """Stop watching `name` (and remove this finder when nothing is
        left to watch), then hand the finished module over."""
        callback = self._callbacks.pop(name, None)
        if callback is None:
            return  # already fired (a reload, or a second finder's copy)
        if not self._callbacks:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        callback(module)


class NeighbourFinder(TorchFinder):
    """The finder for the neighbours (vllm, sglang, torch_memory_saver):
    placed in ``sys.meta_path`` by :func:`watch`."""


class _Loader:
    """torch's own loader, with the callback run after ``exec_module``."""

    def __init__(self, loader: Any, finder: TorchFinder, name: str) -> None:
        self._loader = loader
        self._finder = finder
        self._name = name

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
        self._finder.fire(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def initializing(module: Any) -> bool:
    """Whether `module` is in ``sys.modules`` with its body still running
    (in this thread or another): importlib marks its spec so."""
    try:
        return bool(getattr(getattr(module, "__spec__", None),
                            "_initializing", False))
    except Exception:  # a module whose attributes raise: taken as done
        return False


def _module_lock(name: str) -> Any:
    """importlib's lock for the import of `name`, or None where this
    Python has none to offer."""
    try:
        from importlib import _bootstrap

        return _bootstrap._get_module_lock(name)  # type: ignore[attr-defined]
    except Exception:
        return None


def _place(finder: TorchFinder) -> None:
    """Put `finder` first in sys.meta_path, replacing one of its kind
    already there (any copy of this module's), so that there is never
    more than one of each."""
    kind = type(finder).__name__
    sys.meta_path[:] = [
        f for f in sys.meta_path
        if not (getattr(f, "_allocconf_finder", False)
                and type(f).__name__ == kind)
    ]
    sys.meta_path.insert(0, finder)


def install(callback: Callback) -> TorchFinder:
    """Call ``callback(torch)`` when ``import torch`` finishes."""
    finder = TorchFinder(callback)
    _place(finder)
    return finder


def watch(names: Sequence[str], callback: Callback) -> NeighbourFinder:
    """Call ``callback(module)`` when the import of each of `names`
    finishes."""
    finder = NeighbourFinder(callback, names)
    _place(finder)
    return finder
