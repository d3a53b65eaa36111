"""The tensor engine's errors: asynchronous remote failures, and bad arguments at the call."""

from __future__ import annotations

import traceback
from typing import Any

from ._records import Failure


class RemoteException(Exception):
    """A remote op failed, or read a value that had failed (dependents fail too).

    Raised when the value is fetched, not where the op was issued: everything is asynchronous.
    ``rank`` is the rank where the first failure happened, ``controller_frames`` where the
    failing op was issued in the controller, ``worker_error_string`` the worker's traceback.
    """

    def __init__(
        self,
        failure: Failure,
        controller_frames: list[traceback.FrameSummary] | None,
        message: str = "A remote function has failed asynchronously",
    ) -> None:
        self.failure = failure
        self.rank = failure.rank
        self.seq = failure.seq
        self.exception_type = failure.type_name
        self.worker_error_string = failure.traceback or f"{failure.type_name}: {failure.message}"
        self.controller_frames = list(controller_frames) if controller_frames else None
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = (
            "".join(traceback.format_list(self.controller_frames))
            if self.controller_frames
            else "  <not recorded>\n"
        )
        return (
            f"{self.message} on rank {self.rank}.\n"
            "Traceback of where the remote function was issued on controller "
            f"(most recent call last):\n{where}"
            f"Error as reported from worker:\n{self.worker_error_string.rstrip()}"
        )

    def __reduce__(self) -> Any:
        return (RemoteException, (self.failure, self.controller_frames, self.message))


#: The reasons an argument is refused at the call site (Monarch's names).
LOCAL_TENSOR = "LOCAL_TENSOR"
WRONG_MESH = "WRONG_MESH"
WRONG_STREAM = "WRONG_STREAM"
DROPPED = "DROPPED"
BORROWED = "BORROWED"
MUTATING_BORROW = "MUTATING_BORROW"


def bad_argument(call: str, reason: str, detail: str) -> TypeError:
    """The TypeError for an argument an op cannot take, raised where the op is issued."""
    return TypeError(f"Incorrect arguments to regency operation {call}: {reason}: {detail}")
