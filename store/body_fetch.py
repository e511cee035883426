"""A follower that installed a snapshot without bodies fetches the bodies it lacks from a member.

A snapshot (issue 18) carries, for each live message, its id and body size but not the body.  A
follower that installs one (it was down, or too far behind for the leader's journal) has the bodies
it stored before it fell behind, and none of the messages published meanwhile.  Before it applies
the entries after the snapshot -- deliveries among them need bodies -- it runs ``catch_up``: the
ids it lacks go to another member in requests of bounded size (``plan``), the member answers with
what it has (``serve``), each body is checked against the size the snapshot recorded, and the
bodies go to the local store (``Bodies.install``).

Why this rather than keeping bodies in the journal until every member has them: the journal would
then be pinned by the slowest member (a member down for an hour holds an hour of journal on every
node), and a member that comes back still needs a path for what was compacted.  Here the cost of a
lagging member falls on that member's catch-up only.  The serving member still has every body the
snapshot refers to for one snapshot interval after the snapshot (``Bodies`` defers deletes to the
checkpoint after next); a body it no longer has was deleted by an entry after the snapshot, which
the follower will apply too -- it is reported in ``still_missing`` and the next member asked.

The messages are msgpack: a request ``[1, [id, ...]]``, an answer ``[2, [[id, body], ...]]``.  They
are meant to travel on the authenticated, encrypted Raft transport (raft/wire.py) as one more
message kind; that transport hook is not built yet (see the issue 18 report).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgpack

from .bodies import Bodies

REQUEST, ANSWER = 1, 2
#: An answer carries at most this many body bytes (one body larger than that is sent alone).
ANSWER_BYTES = 8 << 20
#: Ids in one request, whatever their sizes.
REQUEST_IDS = 4096

#: Asks one member for bodies: a request's bytes in, the answer's bytes out.
Ask = Callable[[bytes], bytes]


class FetchError(ValueError):
    """A request or answer that does not decode, or an answer that does not match the request."""


def encode_request(ids: list[int]) -> bytes:
    return msgpack.packb([REQUEST, ids])


def decode_request(data: bytes) -> list[int]:
    try:
        kind, ids = msgpack.unpackb(data, max_array_len=REQUEST_IDS)
    except (ValueError, TypeError, msgpack.ExtraData) as exc:
        raise FetchError(f"bad body request: {exc}") from exc
    if kind != REQUEST or not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise FetchError("bad body request")
    return ids


def encode_answer(items: list[tuple[int, bytes]]) -> bytes:
    return msgpack.packb([ANSWER, [[msg_id, body] for msg_id, body in items]], use_bin_type=True)


def decode_answer(data: bytes) -> list[tuple[int, bytes]]:
    try:
        kind, items = msgpack.unpackb(data, raw=False, max_array_len=REQUEST_IDS)
    except (ValueError, TypeError, msgpack.ExtraData) as exc:
        raise FetchError(f"bad body answer: {exc}") from exc
    if kind != ANSWER or not isinstance(items, list):
        raise FetchError("bad body answer")
    out = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
                and isinstance(item[1], bytes)):
            raise FetchError("bad body answer item")
        out.append((item[0], item[1]))
    return out


def serve(bodies: Bodies, request: bytes, answer_bytes: int = ANSWER_BYTES) -> bytes:
    """A member's answer: the requested bodies it has, in request order, up to ``answer_bytes``
    (at least one).  Read without touching its cache: serving a peer must not evict what this
    node's consumers are about to read."""
    ids = decode_request(request)
    found = bodies.peek(ids)
    out, size = [], 0
    for msg_id in ids:
        body = found.get(msg_id)
        if body is None:
            continue
        if out and size + len(body) > answer_bytes:
            break
        out.append((msg_id, body))
        size += len(body)
    return encode_answer(out)


def plan(needed: dict[int, int], answer_bytes: int = ANSWER_BYTES) -> list[list[int]]:
    """Split the ids needed (id -> body size from the snapshot) into requests whose answers stay
    under ``answer_bytes`` and ``REQUEST_IDS`` ids, in id order (the server reads keys in order)."""
    requests: list[list[int]] = []
    current: list[int] = []
    size = 0
    for msg_id in sorted(needed):
        body_size = needed[msg_id]
        if current and (size + body_size > answer_bytes or len(current) >= REQUEST_IDS):
            requests.append(current)
            current, size = [], 0
        current.append(msg_id)
        size += body_size
    if current:
        requests.append(current)
    return requests


@dataclass(slots=True)
class CatchUp:
    fetched: int = 0
    bytes: int = 0
    requests: int = 0
    still_missing: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # members that did not answer (then the next is asked)


def catch_up(bodies: Bodies, live: dict[int, int], members: Iterable[Ask],
             answer_bytes: int = ANSWER_BYTES) -> CatchUp:
    """Fetch the bodies of ``live`` (message id -> body size, from the installed snapshot) that this
    node lacks, asking ``members`` in turn for what the previous ones did not have."""
    report = CatchUp()
    needed = {msg_id: size for msg_id, size in live.items() if not bodies.has(msg_id)}
    for ask in members:
        if not needed:
            break
        member_failed = False
        for ids in plan(needed, answer_bytes):
            if member_failed:
                break
            remaining = ids
            while remaining:  # an answer may stop early at answer_bytes: ask again for the rest
                report.requests += 1
                asked = set(remaining)
                try:
                    answer = decode_answer(ask(encode_request(remaining)))
                except FetchError as exc:  # the member is down or answered nonsense: the next one
                    report.errors.append(str(exc))
                    member_failed = True
                    break
                for msg_id, body in answer:
                    if msg_id not in asked:
                        raise FetchError(f"answer carries message {msg_id}, not asked for or twice")
                    asked.discard(msg_id)
                    if len(body) != needed[msg_id]:
                        raise FetchError(f"message {msg_id}: body of {len(body)} bytes, "
                                         f"the snapshot says {needed[msg_id]}")
                if not answer:
                    break
                bodies.install(answer)
                for msg_id, body in answer:
                    del needed[msg_id]
                    report.fetched += 1
                    report.bytes += len(body)
                # The member answers in request order and skips what it lacks: ids before its
                # last answer that it did not send, it does not have (the next member is asked).
                last = answer[-1][0]
                remaining = [msg_id for msg_id in remaining if msg_id > last]
    report.still_missing = sorted(needed)
    return report
