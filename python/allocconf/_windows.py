"""The windows: ``expandable_segments(enabled)`` and ``ipc_safe(scope)``,
context managers and decorators over the C core's Window type
(csrc/api/window_type.c), and ``release_pools()``.  Re-exported by the
allocconf package, whose names they are."""
from __future__ import annotations

from allocconf import _C

TYPE_CHECKING = False  # typing costs import time; only checkers need it
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, TypeVar, Union

    F = TypeVar("F", bound=Callable[..., Any])


class _Decorates:
    """The decorator half of a window: a plain or ``async`` function, a
    generator or an async generator runs inside the window.  A window
    whose ``_STEPS`` is true is held while the decorated code itself runs
    (each step of a coroutine or generator), not while it is suspended:
    what runs between its steps (another task on the loop, the loop over
    a generator) is outside it."""

    __slots__ = ()
    _STEPS = False

    def __call__(self, func: F) -> F:
        import functools
        import inspect

        window: Any = self
        steps = self._STEPS
        if inspect.isasyncgenfunction(func):
            return functools.wraps(func)(  # type: ignore[return-value]
                _async_gen_in_window(window, func, steps))
        if inspect.isgeneratorfunction(func):

            @functools.wraps(func)
            def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
                # The window spans the iteration, not only the creation.
                if steps:
                    return (yield from _Steps(window, func(*args, **kwargs)))
                with window:
                    return (yield from func(*args, **kwargs))

            return gen_wrapper  # type: ignore[return-value]
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if steps:
                    return await _Steps(window, func(*args, **kwargs))
                with window:
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with window:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class expandable_segments(_Decorates, _C.Window):
    """Hold expandable segments at ``enabled`` inside a ``with`` block.

    A context manager and a decorator of plain and ``async`` functions and
    of generators and async generators, whose whole iteration then runs
    inside the window.
    Windows nest and may be opened from any thread: expandable segments
    stay off while any ``ipc_safe(scope="process")`` /
    ``expandable_segments(False)`` window is open anywhere in the process,
    and the configuration from before the outermost window comes back when
    the last one closes, also when the block raises: the same string, with
    ``expandable_segments`` named at torch's default in front where the
    window set it and that string left it out (torch keeps the key across
    writes).  A window opened before torch is imported holds when torch
    arrives.

    Only new allocations follow the setting: tensors allocated before the
    window stay where they are.  If torch refuses the write, entering
    raises :class:`AllocConfError` (torch's error as its ``__cause__``) and
    the window is not open.  ``__enter__``/``__exit__`` are in C
    (``allocconf._C.Window``); this class adds the decorator.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"allocconf.expandable_segments({self.enabled})"


class _OpenerWindow(_Decorates, _C.Window):
    """``ipc_safe()``: what the opener allocates inside goes to
    allocconf's pools of classic memory (see :func:`ipc_safe`)."""

    __slots__ = ()
    _STEPS = True

    def __repr__(self) -> str:
        return "allocconf.ipc_safe()"


class _Steps:
    """Run a coroutine, generator or awaitable one step at a time, each
    step inside `window` (send, throw and close forwarded), so that the
    window is open only while that code runs."""

    __slots__ = ("_window", "_inner")

    def __init__(self, window: Any, inner: Any) -> None:
        self._window = window
        self._inner = inner

    def __await__(self) -> _Steps:
        return self

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> Any:
        with self._window:
            return self._inner.send(None)

    def send(self, value: Any) -> Any:
        with self._window:
            return self._inner.send(value)

    def throw(self, *exc: Any) -> Any:
        with self._window:
            return self._inner.throw(*exc)

    def close(self) -> None:
        with self._window:
            self._inner.close()


def _async_gen_in_window(window: Any, func: Callable[..., Any],
                         steps: bool) -> Callable[..., Any]:
    """An async generator function that runs `func`'s iteration inside
    `window` (each of its steps, with `steps`), forwarding
    asend/athrow/aclose (there is no `yield from` for async
    generators)."""

    def step(awaitable: Any) -> Any:
        return _Steps(window, awaitable) if steps else awaitable

    async def agen_wrapper(*args: Any, **kwargs: Any) -> Any:
        agen = func(*args, **kwargs)
        with (_NO_WINDOW if steps else window):
            try:
                item = await step(agen.__anext__())
                while True:
                    try:
                        sent = yield item
                    except GeneratorExit:
                        await step(agen.aclose())
                        raise
                    except BaseException as exc:
                        item = await step(agen.athrow(exc))
                    else:
                        item = await step(agen.asend(sent))
            except StopAsyncIteration:
                return

    return agen_wrapper


class _NoWindow:
    """A window that holds nothing (the async generator above, when each
    step opens its own)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NO_WINDOW = _NoWindow()
_IPC_SAFE = expandable_segments(False)
_OPENER = _OpenerWindow(False, opener=True)
_SCOPES: Dict[str, Union[_OpenerWindow, expandable_segments]] = {
    "opener": _OPENER, "process": _IPC_SAFE}


def ipc_safe(
        scope: str = "opener") -> Union[_OpenerWindow, expandable_segments]:
    """A window whose new CUDA allocations can be shared by classic CUDA
    IPC (``cudaIpcGetMemHandle``): a context manager and a decorator.

    Use it to pack weights for a sync::

        with allocconf.ipc_safe():
            flat = torch.cat([p.detach().flatten() for p in params])
        handle = reductions.reduce_tensor(flat)

    ``scope`` says whose allocations the window covers:

    - ``"opener"`` (the default): what the thread that opens the window
      allocates inside it goes to allocconf's own pools of classic memory
      (one per device, on each device the process has used), through
      torch's ``MemPool`` routing; nothing else in the process changes,
      and torch's setter is not written.  Another thread allocating at
      the same moment keeps expandable segments.  As a decorator of an
      ``async def`` (or a generator), the window is held only while that
      coroutine's own code runs, not across its awaits.  Where the pools
      cannot be used (torch not imported yet or CUDA not initialised yet,
      a torch without pool routing, a CPU or ROCm build,
      ``backend:cudaMallocAsync``), the window holds the process-wide
      way instead: ``status().window_scope`` and
      ``status().window_scope_reason`` say which, and why.
    - ``"process"``: expandable segments are held off for the whole
      process while any such window is open (every thread's allocations
      are classic), through torch's setter: ``expandable_segments(False)``.

    Raises ValueError naming a scope that is neither.
    """
    if not isinstance(scope, str):
        raise TypeError(
            f"allocconf.ipc_safe: scope must be a str, 'opener' or "
            f"'process', not {type(scope).__name__}")
    try:
        return _SCOPES[scope]
    except KeyError:
        raise ValueError(
            f"allocconf.ipc_safe: scope must be 'opener' or 'process', "
            f"not {scope!r}") from None


def release_pools() -> None:
    """Give back the device memory that ``ipc_safe()`` windows' pools
    hold: what is free in them goes back at once, what is still in use
    when it is freed and ``torch.cuda.empty_cache()`` runs.  The next
    window makes a new pool.

    The pools keep what windows freed for the next window, and
    ``torch.cuda.empty_cache()`` does not reach a pool that stays: call
    this when the windows are done for a while (after a weight sync
    whose buffers you dropped).  torch ends a pool with an assertion that
    no thread on its device is inside a pool context
    (``torch.cuda.use_mem_pool``, a torch_memory_saver region) or a CUDA
    graph capture: call it where none is.  Raises RuntimeError, changing
    nothing, while an ``ipc_safe()`` window routes to a pool.
    ``status().pool_bytes`` says what the pools hold.
    """
    _C._release_pools()


# Public under the package's name (reprs, pickles, the API docs).
for _public in (expandable_segments, ipc_safe, release_pools):
    _public.__module__ = "allocconf"
del _public
