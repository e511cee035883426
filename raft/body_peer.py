"""Body fetches between members over the Raft port (issue 18; store/disk/body_fetch.py).

A follower that installed a snapshot without bodies asks other members for the bodies it lacks.
The request travels as a pysyncobj *utility message* (``["bodies", request bytes]``) on the
member's Raft address, the way ``raftmq cluster status`` does (raft/wire.py ``admin_utility``):
the same authenticated, encrypted framing keyed by the cluster secret, no new port, no new
listener.  The member answers in its Raft thread from its pending bodies and its LMDB body store
(``Bodies.peek``: a dict lookup and LMDB read transactions, both safe beside the event loop's
writes); an answer is at most ``body_fetch.ANSWER_BYTES`` (8 MiB), a few ms of the tick.

Wiring (raft/cluster.py): ``serve_bodies(replica, bodies)`` when Raft starts; after ``_install``,
``body_fetch.catch_up(bodies, live, [ask(...) for each other member])`` in a worker thread before
the next entry is applied.  The same request repairs damaged bodies (issue 29,
``body_fetch.fetch_intact``, ``ClusterLog._repair_bodies``): the answer carries each body's CRC32C
and only bodies the member's store verified, and the asker checks every one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from raftmq.store.disk.bodies import Bodies
from raftmq.store.disk.body_fetch import Ask, FetchError, serve

from .wire import admin_utility

if TYPE_CHECKING:
    from .replica import Replica

log = logging.getLogger(__name__)

COMMAND = "bodies"


def serve_bodies(replica: Replica, bodies: Bodies) -> None:
    """Answer body requests on ``replica``'s Raft port (pysyncobj's transport, its tick thread)."""
    transport = replica._SyncObj__transport  # pysyncobj keeps it private

    def on_request(args: list, callback: Callable[[bytes, object], None]) -> None:
        if len(args) != 1 or not isinstance(args[0], bytes):
            callback(b"", None)  # pysyncobj then answers "SUCCESS bodies ...": decode_answer refuses it
            return
        try:
            callback(serve(bodies, args[0]), None)
        except FetchError as exc:
            log.warning("refused a body request: %s", exc)
            callback(b"", None)

    transport.setOnUtilityMessageCallback(COMMAND, on_request)


def ask(secret: str, address: str, timeout: float = 10.0) -> Ask:
    """A function that sends one request to the member at ``address`` ("host:port") and returns its
    answer's bytes (``FetchError`` when it does not answer or answers something else)."""

    def call(request: bytes) -> bytes:
        utility = admin_utility(secret, timeout)
        try:
            answer = utility.executeCommand(address, [COMMAND, request])
        except Exception as exc:  # pysyncobj raises UtilityException, or OSError on connect
            raise FetchError(f"member {address} did not answer: {exc}") from exc
        if not isinstance(answer, bytes):
            raise FetchError(f"member {address} answered {answer!r:.80}")
        return answer

    return call
