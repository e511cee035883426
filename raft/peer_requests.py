"""Requests between members over the Raft port, for the state machine's own use.

A follower that installed a snapshot without message bodies asks other members for the bodies it
lacks, and a node repairs a damaged body from a member's intact copy (store/disk/body_fetch.py).
The request travels as a pysyncobj *utility message* (``[name, request bytes]``) on the member's
Raft address, the way ``raftmq cluster status`` does (raft/wire.py ``admin_utility``): the same
authenticated, encrypted framing keyed by the cluster secret, no new port, no new listener.  The
member answers in its Raft thread (the handler must be safe beside the event loop: the body store's
is a dict lookup and LMDB read transactions).

The log knows only names and bytes: what a request means is the state machine's business
(``raft.log.PeerRequests``; ``ClusterLog`` offers it to the machine at start).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .wire import admin_utility

log = logging.getLogger(__name__)


class PeerRequestFailed(ConnectionError):
    """A member did not answer a request, or answered something else than bytes."""


def serve(replica, name: str, handler: Callable[[bytes], bytes]) -> None:
    """Answer requests named ``name`` on ``replica``'s Raft port (pysyncobj's transport, its tick
    thread).  A handler that raises answers nothing usable: the asker gets PeerRequestFailed."""
    transport = replica._SyncObj__transport  # pysyncobj keeps it private

    def on_request(args: list, callback) -> None:
        if len(args) != 1 or not isinstance(args[0], bytes):
            callback(b"", None)  # pysyncobj then answers "SUCCESS <name> ...": not bytes, refused
            return
        try:
            callback(handler(args[0]), None)
        except Exception as exc:  # noqa: BLE001 - a bad request must not stop the Raft thread
            log.warning("refused a %s request: %s", name, exc)
            callback(b"", None)

    transport.setOnUtilityMessageCallback(name, on_request)


def ask(secret: str, address: str, name: str, timeout: float = 10.0) -> Callable[[bytes], bytes]:
    """A function that sends one ``name`` request to the member at ``address`` ("host:port") and
    returns its answer's bytes (PeerRequestFailed when it does not answer or answers something else)."""

    def call(request: bytes) -> bytes:
        utility = admin_utility(secret, timeout)
        try:
            answer = utility.executeCommand(address, [name, request])
        except Exception as exc:  # pysyncobj raises UtilityException, or OSError on connect
            raise PeerRequestFailed(f"member {address} did not answer: {exc}") from exc
        if not isinstance(answer, bytes) or not answer:
            raise PeerRequestFailed(f"member {address} answered {answer!r:.80}")
        return answer

    return call
