"""The ``@endpoint`` decorator and the ``Actor`` base class.

Typing: ``@endpoint`` keeps the method's parameters (a ``ParamSpec``) and its result type
(the awaited type for ``async def``), and ``ProcMesh.spawn`` returns the actor class's own
type, as Monarch's does. So, to the type checker, ``mesh.incr`` is an
``Endpoint[(by: int), None]`` and ``mesh.incr.call_one("x")`` is an error, while at run time
the mesh's ``__getattr__`` builds the endpoint.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    overload,
)

if TYPE_CHECKING:
    from ._adverbs import Endpoint
    from ._channel import Port
    from ._future import Future
    from ._shape import DimIndex, Extent, SplitArg

P = ParamSpec("P")
R = TypeVar("R")


class EndpointSpec(Generic[P, R]):
    """What ``@endpoint`` leaves on the class: the function and how to call it.

    Accessed on an actor instance it is the plain bound method (an actor may call its own
    endpoints directly); on an actor mesh it becomes an :class:`~regency.core.Endpoint`.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        explicit_response_port: bool = False,
        propagate: Any = None,
    ) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.explicit_response_port = explicit_response_port
        self.propagate = propagate
        #: ``@concurrent_endpoint``: each call runs as its own task; the mailbox moves on.
        self.concurrent = False
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @property
    def _explicit_response_port(self) -> bool:
        """Monarch's name for "the reply goes through a port the body is given": true for
        ``explicit_response_port=True`` and for every ``@concurrent_endpoint`` (Monarch
        builds those on an explicit port; here the runtime replies for them, the same
        way)."""
        return self.explicit_response_port or self.concurrent

    # On an actor instance (``self.incr`` inside the actor) this is the plain bound method;
    # the type checker is told "Endpoint", which is what the same name is on a mesh (where
    # ``spawn`` returns the actor class's type). An endpoint called directly type-checks
    # through ``Endpoint.__call__``.
    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> EndpointSpec[P, R]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Endpoint[P, R]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self.fn.__get__(obj, objtype)


class _EndpointDecorator(Protocol):
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], Awaitable[R]], /) -> EndpointSpec[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], R], /) -> EndpointSpec[P, R]: ...


class _PortEndpointDecorator(Protocol):
    """``@endpoint(explicit_response_port=True)``: the method's first parameter is the
    reply port, which callers do not pass; the endpoint's result type is the port's."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[Any, Port[R], P], Awaitable[None]], /
    ) -> EndpointSpec[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, Port[R], P], None], /) -> EndpointSpec[P, R]: ...


@overload
def endpoint(fn: Callable[Concatenate[Any, P], Awaitable[R]], /) -> EndpointSpec[P, R]: ...
@overload
def endpoint(fn: Callable[Concatenate[Any, P], R], /) -> EndpointSpec[P, R]: ...
@overload
def endpoint(
    *,
    explicit_response_port: Literal[True],
    propagate: Any = None,
    instrument: bool = True,
) -> _PortEndpointDecorator: ...
@overload
def endpoint(
    *,
    explicit_response_port: Literal[False] = False,
    propagate: Any = None,
    instrument: bool = True,
) -> _EndpointDecorator: ...
def endpoint(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    explicit_response_port: bool = False,
    propagate: Any = None,
    instrument: bool = True,
) -> Any:
    """Mark an actor method as callable through meshes. Sync and async methods both work,
    also mixed in one actor (Monarch requires all of one kind; Regency does not)."""

    def wrap(f: Callable[..., Any]) -> EndpointSpec[..., Any]:
        if not callable(f):
            raise TypeError(f"@endpoint decorates a function (got {f!r})")
        return EndpointSpec(f, explicit_response_port=explicit_response_port, propagate=propagate)

    if fn is not None:
        return wrap(fn)
    return wrap


class _ConcurrentDecorator(Protocol):
    def __call__(
        self, fn: Callable[Concatenate[Any, P], Awaitable[R]], /
    ) -> EndpointSpec[P, R]: ...


class _PortConcurrentDecorator(Protocol):
    def __call__(
        self, fn: Callable[Concatenate[Any, Port[R], P], Awaitable[None]], /
    ) -> EndpointSpec[P, R]: ...


@overload
def concurrent_endpoint(
    fn: Callable[Concatenate[Any, P], Awaitable[R]], /
) -> EndpointSpec[P, R]: ...
@overload
def concurrent_endpoint(
    *,
    explicit_response_port: Literal[True],
    propagate: Any = None,
    instrument: bool = True,
) -> _PortConcurrentDecorator: ...
@overload
def concurrent_endpoint(
    *,
    explicit_response_port: Literal[False] = False,
    propagate: Any = None,
    instrument: bool = True,
) -> _ConcurrentDecorator: ...
def concurrent_endpoint(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    explicit_response_port: bool = False,
    propagate: Any = None,
    instrument: bool = True,
) -> Any:
    """An async endpoint whose calls do not wait for each other (Monarch's
    ``@concurrent_endpoint``): each message starts its own task on the proc's loop and the
    actor's mailbox moves on at once, so a call that waits (for input, for another call)
    never holds up the next. Only the start order is guaranteed. A call with a caller
    waiting answers it (value or error); one without, that raises, fails the actor."""

    def wrap(f: Callable[..., Any]) -> EndpointSpec[..., Any]:
        if isinstance(f, EndpointSpec):
            raise ValueError(
                f"@concurrent_endpoint does not wrap @endpoint (on {f.name}): use "
                "@concurrent_endpoint alone and give it the endpoint options, e.g. "
                "@concurrent_endpoint(explicit_response_port=True)"
            )
        if not inspect.iscoroutinefunction(f):
            raise ValueError(
                "@concurrent_endpoint can only wrap async endpoints: make "
                f"{getattr(f, '__qualname__', f)!s} an `async def` (got {type(f).__name__} "
                f"{f!r})"
            )
        spec: EndpointSpec[..., Any] = EndpointSpec(
            f, explicit_response_port=explicit_response_port, propagate=propagate
        )
        spec.concurrent = True
        return spec

    if fn is not None:
        return wrap(fn)
    return wrap


class Actor:
    """Base class of user actors. Subclass it, add ``@endpoint`` methods, spawn it on a
    ``ProcMesh``. Each actor handles one message at a time; sync endpoints run on the
    actor's own thread (so they may block, e.g. on another actor's ``.get()``), async
    endpoints on its proc's trio loop."""

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class (Monarch's ``self.logger``), at DEBUG as
        Monarch's is, so ``self.logger.info(...)`` reaches the proc's handlers whatever the
        root level; its records carry the ``[actor=...]`` prefix. Assignable."""
        cls = type(self)
        logger = logging.getLogger(f"{cls.__module__}.{cls.__qualname__}")
        logger.setLevel(logging.DEBUG)
        return logger

    if TYPE_CHECKING:
        # What a spawned mesh offers, for the type checker only: ``ProcMesh.spawn`` returns
        # the actor class's type (as Monarch's does), so these are the mesh's methods.
        def slice(self, /, **dims: DimIndex) -> Self: ...
        def flatten(self, name: str) -> Self: ...
        def split(self, /, **kw: SplitArg) -> Self: ...
        def rename(self, /, **kw: str) -> Self: ...
        def size(self, dim: str | None = None) -> int: ...
        @property
        def sizes(self) -> dict[str, int]: ...
        @property
        def extent(self) -> Extent: ...
        @property
        def initialized(self) -> Future[None]: ...
        def endpoint(self, name: str) -> Endpoint[..., Any]: ...
        def stop(self, reason: str = "stopped by client") -> Future[None]: ...


def endpoints_of(cls: type) -> dict[str, EndpointSpec[..., Any]]:
    """The endpoints of an actor class, by name (inherited ones included)."""
    table: dict[str, EndpointSpec[..., Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointSpec):
                table[name] = value
            elif name in table:
                del table[name]
    return table
