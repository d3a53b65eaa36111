"""The simulator runs the production executor: actor threads, not a simulated stand-in.

A trace probe (``sys.settrace`` on every thread) records which methods of ``ActorCell`` run
during a simulation; the thread path that every actor with a plain ``def`` endpoint takes in
production must be among them, and so must the loop path of all-async actors.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import trio

from regency.actor import Actor, concurrent_endpoint, endpoint
from regency.core import _mailbox
from regency.sim import current, simulate

#: The mailbox loop, written once: both drivers run these generators.
MAILBOX_LOOP = {"_main", "_call", "_supervise", "_die", "_stop", "_wind_down"}
#: The thread driver (every actor with a sync endpoint, in production) and the loop driver.
THREAD_PATH = {"_thread_main"} | MAILBOX_LOOP
LOOP_PATH = {"_task_main", "_main", "_call", "_call_async", "_stop", "_wind_down"}


@contextmanager
def methods_run(module_file: str) -> Iterator[set[tuple[str, str]]]:
    """(name, "loop" or "thread") of the functions of ``module_file`` called meanwhile:
    "loop" on this thread (a simulation's loop runs on its caller's), "thread" elsewhere."""
    seen: set[tuple[str, str]] = set()
    loop = threading.get_ident()

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == module_file:
            where = "loop" if threading.get_ident() == loop else "thread"
            seen.add((frame.f_code.co_name, where))

    threading.settrace(tracer)  # type: ignore[arg-type]
    sys.settrace(tracer)  # type: ignore[arg-type]
    try:
        yield seen
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]


class Child(Actor):
    @endpoint
    def explode(self) -> None:
        raise SystemExit("planned death")

    @endpoint
    def ping(self) -> str:
        return "pong"


class Boss(Actor):
    """Sync: owns children, supervises their failure, cleans up when stopped."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.cleaned = False

    @endpoint
    def build(self, procs: Any) -> str:
        self.children = procs.spawn("children", Child)
        return str(self.children.ping.call().get().values())

    @endpoint
    def blow_up_children(self) -> None:
        self.children.explode.broadcast()

    @endpoint
    def failures(self) -> list[str]:
        return self.seen

    def __supervise__(self, failure: Any) -> bool:
        self.seen.append(failure.mesh_name)
        return True

    def __cleanup__(self, exc: BaseException | None) -> None:
        self.cleaned = True


class Napper(Actor):
    """All async: a trio task in production and simulated alike."""

    @endpoint
    async def nap(self, seconds: float) -> float:
        await trio.sleep(seconds)
        return seconds


def program(hosts: Any) -> tuple[str, list[str], float]:
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    boss = procs.slice(hosts=0).spawn("boss", Boss)
    built = boss.build.call_one(procs.slice(hosts=1)).get()
    boss.blow_up_children.call_one().get()
    seen: list[str] = []
    for _ in range(20):
        seen = boss.failures.call_one().get()
        if seen:
            break
        procs.slice(hosts=0).spawn("napper", Napper).nap.call_one(0.5).get()
    nappers = procs.slice(hosts=0).spawn("nappers", Napper)
    napped = nappers.nap.call(1.0).get().values()[0]
    nappers.stop().get()
    boss.stop().get()
    return built, seen, napped


def test_a_simulated_run_executes_the_production_thread_path() -> None:
    with methods_run(_mailbox.__file__) as seen:
        result = simulate(program, seed=4, hosts=2)
    assert result.value == ("['pong']", ["children"], 1.0)
    on_threads = {name for name, where in seen if where == "thread"}
    on_loop = {name for name, where in seen if where == "loop"}
    # Sync actors ran the whole mailbox loop on their (lockstep) threads, through the thread
    # driver, as in production; all-async ones on the loop, through the loop driver.
    assert on_threads >= THREAD_PATH, sorted(THREAD_PATH - on_threads)
    assert on_loop >= LOOP_PATH, sorted(LOOP_PATH - on_loop)


def test_sync_actors_run_on_their_own_lockstep_thread() -> None:
    names: list[str] = []

    class Where(Actor):
        @endpoint
        def thread(self) -> str:
            return threading.current_thread().name

    def where(hosts: Any) -> list[str]:
        mesh = hosts.spawn_procs(per_host={"gpus": 2}).spawn("where", Where)
        names.extend(mesh.thread.call().get().values())
        return names

    result = simulate(where, seed=1, hosts=1)
    # Two actors, two threads, neither of them the simulation's loop thread.
    assert len(set(result.value)) == 2
    assert threading.current_thread().name not in result.value


AFTER_CRASH: list[str] = []


class Waiter(Actor):
    """Sync: blocks its actor thread on another actor's reply."""

    @endpoint
    def wait_on(self, napper: Any, seconds: float) -> str:
        try:
            napper.nap.call_one(seconds).get()
        finally:
            # However the wait ends (an answer, or its port failing as the dead proc's
            # runtime is torn down), a killed process's thread never gets here.
            AFTER_CRASH.append("the dead proc's thread ran on")
        return "woke"


def test_a_crashed_procs_actor_thread_never_runs_again() -> None:
    AFTER_CRASH.clear()

    def program(hosts: Any) -> tuple[str, float]:
        napper = hosts.slice(hosts=0).spawn_procs().spawn("napper", Napper)
        waiter_procs = hosts.slice(hosts=1).spawn_procs()
        waiter = waiter_procs.spawn("waiter", Waiter)
        waiting = waiter.wait_on.call_one(napper, 5.0)
        napper.nap.call_one(1.0).get()  # the waiter's thread is blocked by now
        current().crash_proc(waiter_procs)
        try:
            waiting.get()
            return "answered", current().now()
        except Exception as exc:
            napper.nap.call_one(10.0).get()  # the napper's reply to the dead proc comes and goes
            return type(exc).__name__, round(current().now())

    result = simulate(program, seed=2, hosts=2)
    assert result.value[0] == "SupervisionError"
    assert AFTER_CRASH == []


class GivingUpOwner(Actor):
    """All async: does not handle its children's failure while an endpoint of it sleeps."""

    @endpoint
    async def outlive_children(self, procs: Any) -> str:
        children = procs.spawn("children", Child)
        children.explode.broadcast()
        await trio.sleep(3600)
        return "outlived"

    def __supervise__(self, failure: Any) -> bool:
        return False


def test_an_owner_that_gives_up_fails_at_its_await_point_in_the_simulator() -> None:
    """The same mailbox code as production: the owner's endpoint is cancelled at its await
    point when its ``__supervise__`` does not handle the failure, in virtual seconds, not
    after the hour it sleeps; the root is told the owner failed."""

    def program(hosts: Any) -> tuple[str, float, list[str]]:
        import regency.actor

        roots: list[str] = []
        hook = regency.actor.unhandled_fault_hook  # (the process's: put back after)
        regency.actor.unhandled_fault_hook = lambda failure: roots.append(failure.mesh_name)
        try:
            procs = hosts.spawn_procs(per_host={"gpus": 1})
            # (on procs of its own: the owner's and the children's are poisoned)
            napper = hosts.slice(hosts=0).spawn_procs().spawn("napper", Napper)
            owner = procs.slice(hosts=0).spawn("owner", GivingUpOwner)
            try:
                owner.outlive_children.call_one(procs.slice(hosts=1)).get()
                return "returned", current().now(), roots
            except Exception as exc:
                while not roots:  # the root hears of the owner a moment later
                    napper.nap.call_one(0.1).get()
                return f"{type(exc).__name__}: {exc}", current().now(), roots
        finally:
            regency.actor.unhandled_fault_hook = hook

    for seed in (1, 2, 5):
        result = simulate(program, seed=seed, hosts=2)
        again = simulate(program, seed=seed, hosts=2)
        assert result.trace_hash == again.trace_hash  # replayable from its seed
        error, when, roots = result.value
        assert error.startswith("SupervisionError"), error
        assert "unhandled failure of a mesh" in error, error
        assert when < 60, f"the owner failed only after {when} virtual seconds"
        assert roots == ["owner"]


class CatchingOwner(GivingUpOwner):
    """Gives up too, but its endpoint catches the cancellation and returns a value."""

    @endpoint
    async def outlive_children(self, procs: Any) -> str:
        children = procs.spawn("children", Child)
        children.explode.broadcast()
        try:
            await trio.sleep(3600)
        except trio.Cancelled:
            return "caught"
        return "outlived"


class Aborter(Actor):
    @endpoint
    async def abort_then_finish(self) -> str:
        from regency.actor import context

        context().actor_instance.abort("on purpose")
        await trio.sleep(1)
        return "finished after abort"


class ConcurrentFailer(Actor):
    @endpoint
    async def long(self) -> str:
        await trio.sleep(100)
        return "long done"

    @concurrent_endpoint
    async def boom(self) -> None:
        await trio.sleep(1)
        raise ValueError("concurrent boom")


def _outcome(fut: Any) -> str:
    try:
        return f"returned {fut.get()!r}"
    except Exception as exc:
        return type(exc).__name__


def test_an_endpoint_that_catches_the_cancellation_still_answers_with_the_death() -> None:
    """The caller of a cancelled endpoint gets SupervisionError even when the endpoint
    catches the cancellation and returns: one answer, the actor's death, never a success
    from a dead actor."""

    def program(hosts: Any) -> tuple[str, str]:
        import regency.actor

        hook = regency.actor.unhandled_fault_hook
        regency.actor.unhandled_fault_hook = lambda failure: None
        try:
            procs = hosts.spawn_procs(per_host={"gpus": 1})
            owner = procs.slice(hosts=0).spawn("owner", CatchingOwner)
            first = _outcome(owner.outlive_children.call_one(procs.slice(hosts=1)))
            return first, _outcome(owner.outlive_children.call_one(procs.slice(hosts=1)))
        finally:
            regency.actor.unhandled_fault_hook = hook

    assert simulate(program, seed=5, hosts=2).value == ("SupervisionError", "SupervisionError")


def test_abort_and_concurrent_failures_still_wait_for_the_current_message() -> None:
    """Only an unhandled failure of an owned mesh cancels a suspended endpoint: an
    ``abort()`` inside it, and a concurrent endpoint that fails with no caller, fail the
    actor after the current message, as documented (docs/api.md)."""

    def program(hosts: Any) -> tuple[str, str, float]:
        import regency.actor

        hook = regency.actor.unhandled_fault_hook
        regency.actor.unhandled_fault_hook = lambda failure: None
        try:
            procs = hosts.spawn_procs(per_host={"gpus": 1})
            aborted = _outcome(
                procs.slice(hosts=0).spawn("aborter", Aborter).abort_then_finish.call_one()
            )
            failer = procs.slice(hosts=1).spawn("failer", ConcurrentFailer)
            failer.boom.broadcast()
            start = current().now()
            long = _outcome(failer.long.call_one())
            return aborted, long, current().now() - start
        finally:
            regency.actor.unhandled_fault_hook = hook

    aborted, long, took = simulate(program, seed=5, hosts=2).value
    assert aborted == "returned 'finished after abort'"
    assert long == "returned 'long done'" and took >= 100
