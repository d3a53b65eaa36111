"""Whether the frame a thread sends next answers a message it waited for.

A socket connection queues a frame sent less than ``_BURST_WINDOW`` after its previous one
for its writer task, which sends the whole burst with one ``sendmsg`` (``_sockets.py``). A
time rule alone cannot tell a burst from a fast request/response exchange: where a round
trip takes less than the window, every reply looks like a burst and waits for the loop to
wake up and write it. The core marks a thread that waited for a message (``Future.get``,
an actor thread's wait for its next call: ``answering.waited = True``); the next frame that
thread sends goes out at once, whatever the time since its connection's last frame, and the
frames after it are judged by the window again. (An acknowledgement a reading thread sends
meanwhile leaves the mark for the answer: ``core/_inbound.py``.)
"""

from __future__ import annotations

import threading


class _Answering(threading.local):
    #: This thread waited for a message since it last sent a frame.
    waited = False


answering = _Answering()
