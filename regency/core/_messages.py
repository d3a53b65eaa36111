"""The kinds of runtime frames and the layout of their envelopes.

Envelopes are plain tuples (fast to pickle, no class lookup at the receiver); the first field
is the kind. ``port`` fields are ``(address, port_id)`` or ``None`` when no reply is wanted.

=============  ==============================================================  ============
kind           envelope fields after the kind                                  payload
=============  ==============================================================  ============
CALL           actor_key, method, port, rank, labels, sizes                    (args, kwargs)
PORT           port_id, index, status                                          value
SPAWN          actor_key, name, rank, labels, sizes, port, owner                (cls, args, kwargs)
STOP_ACTOR     actor_key, port                                                 -
STOP_PROC      port                                                            -
HELLO          proc_id, address                                                -
FAILED         mesh_key, rank                                                  FailureCause
HEARTBEAT      address                                                         -
=============  ==============================================================  ============

``owner`` is ``(address, actor_key, name)`` of the actor that spawned the mesh (``actor_key``
is ``"client"`` for the controller's main code): FAILED reports go there.
"""

from __future__ import annotations

CALL = 0
PORT = 1
SPAWN = 2
STOP_ACTOR = 3
STOP_PROC = 4
HELLO = 5
FAILED = 6
HEARTBEAT = 7
# Multi-host (regency/core/_hosts.py, _worker.py): controller <-> worker daemon.
ATTACH = 20  # controller_address, lease_seconds, port -> (hostname, host_ip, ports)
RESERVE = 21  # count, port -> ports
LAUNCH = 22  # payload: list of (bootstrap record, env)
EXITED = 23  # address, code (worker -> controller)
KILL = 24  # address
LEASE = 25  # (controller -> worker, renews the lease)
DETACH = 26  # (controller -> worker, on a clean exit)
REFUSED = 27  # address, reason (worker -> controller: that proc was not launched)
LAPSED = 28  # worker_address, reason (worker -> controller: it no longer serves it)

# PORT statuses
OK = 0
#: The endpoint raised; the payload is a RemoteFailure. The actor goes on.
ERROR = 1
#: The actor cannot take calls (failed, stopped); the payload is a RemoteFailure.
DEAD = 2
