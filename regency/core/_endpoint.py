"""The ``@endpoint`` decorator and the ``Actor`` base class."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

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

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> EndpointSpec[P, R]: ...
    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Callable[P, R]: ...
    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return self.fn.__get__(obj, objtype)


@overload
def endpoint(fn: Callable[..., R], /) -> EndpointSpec[..., R]: ...
@overload
def endpoint(
    *, explicit_response_port: bool = False, propagate: Any = None, instrument: bool = True
) -> Callable[[Callable[..., R]], EndpointSpec[..., R]]: ...
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


@overload
def concurrent_endpoint(fn: Callable[..., R], /) -> EndpointSpec[..., R]: ...
@overload
def concurrent_endpoint(
    *, explicit_response_port: bool = False, propagate: Any = None, instrument: bool = True
) -> Callable[[Callable[..., R]], EndpointSpec[..., R]]: ...
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
        if not inspect.iscoroutinefunction(f):
            raise TypeError(f"@concurrent_endpoint decorates an async function (got {f!r})")
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
