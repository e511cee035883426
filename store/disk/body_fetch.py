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

The messages are msgpack: a request ``[1, [id, ...]]``, an answer ``[2, [[id, body, crc], ...]]``.
They travel on the authenticated, encrypted Raft transport (raft/peer_requests.py, request name
``PEER_REQUEST``); an ``Ask`` raises ConnectionError (or FetchError) when a member does not answer.

**Checksums** (issue 29).  The serving member sends only bodies its store verified, each with its
CRC32C; the fetcher checks every body against it (and, repairing a damaged body, against the
CRC32C its own verified segment header recorded, ``BodyStore.expected_crc``) before it writes it.
An answer of a member without checksums (``[id, body]``, the previous version) is accepted for a
catch-up (sizes are still checked) but not for a repair, which needs a checksum to trust a copy.
The same request also repairs damaged bodies (``fetch_intact``): ask each member in turn for the
ids still missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgpack

from raftmq.integrity import checksum

from .bodies import Bodies

REQUEST, ANSWER = 1, 2
#: An answer carries at most this many body bytes (one body larger than that is sent alone).
ANSWER_BYTES = 8 << 20
#: Ids in one request, whatever their sizes.
REQUEST_IDS = 4096

#: Asks one member for bodies: a request's bytes in, the answer's bytes out.
Ask = Callable[[bytes], bytes]
PEER_REQUEST = "bodies"  # the request's name on the Raft port


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
    """An answer: each body with its CRC32C (computed here from bytes the store just verified, or
    from a body still in memory)."""
    return msgpack.packb([ANSWER, [[msg_id, body, checksum(body)] for msg_id, body in items]],
                         use_bin_type=True)


def decode_answer(data: bytes, verify: bool = True) -> list[tuple[int, bytes]]:
    """The answer's ``(id, body)`` items; each body is checked against the CRC32C it came with
    (FetchError if one fails: that member's answer is not trusted).  ``verify=False`` keeps items
    without a checksum (``decode_answer_items``)."""
    out = []
    for msg_id, body, crc in decode_answer_items(data):
        if crc is not None and checksum(body) != crc:
            raise FetchError(f"message {msg_id}: the body does not match its checksum")
        if crc is None and verify:
            raise FetchError(f"message {msg_id}: answered without a checksum")
        out.append((msg_id, body))
    return out


def decode_answer_items(data: bytes) -> list[tuple[int, bytes, int | None]]:
    try:
        kind, items = msgpack.unpackb(data, raw=False, max_array_len=REQUEST_IDS)
    except (ValueError, TypeError, msgpack.ExtraData) as exc:
        raise FetchError(f"bad body answer: {exc}") from exc
    if kind != ANSWER or not isinstance(items, list):
        raise FetchError("bad body answer")
    out = []
    for item in items:
        if not (isinstance(item, list) and len(item) in (2, 3) and isinstance(item[0], int)
                and isinstance(item[1], bytes) and (len(item) == 2 or isinstance(item[2], int))):
            raise FetchError("bad body answer item")
        out.append((item[0], item[1], item[2] if len(item) == 3 else None))
    return out


def serve(bodies: Bodies, request: bytes, answer_bytes: int = ANSWER_BYTES) -> bytes:
    """A member's answer: the requested bodies it has, in request order, up to ``answer_bytes``
    (at least one).  Read without touching its cache: serving a peer must not evict what this
    node's consumers are about to read."""
    ids = decode_request(request)
    found = bodies.peek(ids)
    out: list[tuple[int, bytes]] = []
    size = 0
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
                    answer = decode_answer(ask(encode_request(remaining)), verify=False)
                except (FetchError, ConnectionError) as exc:  # the member is down or answered nonsense: the next one
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


def fetch_intact(ids: Iterable[int], members: Iterable[Ask], expected: Callable[[int], int | None],
                 answer_bytes: int = ANSWER_BYTES) -> dict[int, bytes]:
    """Intact copies of damaged bodies: ask ``members`` in turn for the ids the previous ones did not
    give.  A body is kept only if it matches the checksum the member sent with it and, when
    ``expected(id)`` knows the checksum it was written with here, that one too; a member whose
    answer fails either is not asked further (the next one is)."""
    needed = sorted(set(ids))
    found: dict[int, bytes] = {}
    for ask in members:
        if not needed:
            break
        try:
            for start in range(0, len(needed), REQUEST_IDS):
                remaining = needed[start:start + REQUEST_IDS]
                while remaining:
                    asked = set(remaining)
                    answer = decode_answer(ask(encode_request(remaining)))
                    for msg_id, body in answer:
                        if msg_id not in asked:
                            raise FetchError(f"answer carries message {msg_id}, not asked for or twice")
                        asked.discard(msg_id)
                        crc = expected(msg_id)
                        if crc is not None and checksum(body) != crc:
                            raise FetchError(f"message {msg_id}: the member's body does not match "
                                             "the checksum it was written with here")
                        found[msg_id] = body
                    if not answer:
                        break
                    last = answer[-1][0]
                    remaining = [msg_id for msg_id in remaining if msg_id > last]
        except (FetchError, ConnectionError):  # down, answered nonsense or a damaged copy: the next member
            pass
        needed = [msg_id for msg_id in needed if msg_id not in found]
    return found
