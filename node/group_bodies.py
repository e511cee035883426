"""Bodies of queue groups' deliveries across the link (issue 34): bounded in the main process as
they are with one group (docs/design.md "Bodies across the link").

With one group a delivery whose consumer holds its message until it settles it (manual ack, 0-10
explicit accept, an unsettled 1.0 link) leaves apply without its body, and the front end reads the
body when it writes the delivery (store/disk/bodies.py ``fill_bodies``, "bodies when sent"): what
waits behind a full socket, a closed 1.0 window or a client's prefetch is references.  A queue
group's worker applies in another process, whose body store the main process could not read, so it
gave every delivery its body at apply and sent them all over the link: a backlog attached to a
consumer crossed the link whole and sat in the main process's memory (+68 MiB for a 64 MiB
backlog in tests/integration/test_backpressure.py).

Now a held delivery crosses the link either with its body or as a reference, and either way at
once and in order (the front ends' rules for order, parking, cancel and close are unchanged):

* **Carried** (:class:`Carrier`, in the worker) while the connection's *carry credit* allows, by
  the message's size: at most :func:`carry_bytes` (twice the connection's ``write_buffer_high``, at
  least 1 MiB) of carried bodies per connection are outstanding, i.e. not yet handed back by the
  main process.  The worker gives the body from its memory or reads it from its store, as one
  group's front end would (one read for a batch's misses, repaired from the members if damaged).
  A consumer that keeps up costs what it cost before: the body goes with the delivery, read where
  it was read before.
* **A reference** past the credit: the worker first writes the body to its body store if it was
  only in memory (``Bodies.spill``, with the pending bodies older than it), and the main process
  reads it from that store, read-only, when the front end writes the delivery (:class:`GroupBodies`,
  store/disk/body_reader.py: every body verified against its CRC32C, a single node's persistent
  ones from its durable store's sealed records).  The main process knows it by a *tagged* id
  (store/disk/bodies.py ``tag_id``: negative, the group in it), set on its copy of the message.
* **Credit back** (:meth:`GroupBodies.settle`): after dispatching a worker's outputs, the main
  process hands a connection's carried bytes back once what the connection holds (``held_bytes``:
  write buffer, parked bodies, a 0-9-1 channel's or a 1.0 link's held bodies) is under half the
  credit -- at once for a consumer that keeps up; while it is stalled, not until it drains (looked
  at again every ``RECHECK_SECONDS``); at once for a connection that is gone.  So the main process
  holds at most the credit of carried bodies per connection and group beyond what the connection's
  own bounds allow, and reads the rest from disk as one group does.

Deliveries that do not hold their message (auto-ack, accept-mode none, pre-settled, browsed), a
basic.get's answer and a resumed session's replay are carried always, as one group carries them
(they may be deleted right after the batch); the front ends' credit slices bound them.

A body the main process finds damaged is replaced as one group's read replaces it: the main
process asks the group's members for an intact copy over their Raft ports (``body_fetch.fetch_intact``,
checked against the checksum the worker's verified header records) while the delivery waits, and
the worker is asked to repair its own copy (frame ``b``).  Without one (a single node, or no member
has it intact) the delivery is refused as one group refuses it: not sent, the message stays held,
not acked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from raftmq.raft import peer_requests
from raftmq.store.core.commands import OUT_DELIVER, OUT_TRANSFER
from raftmq.store.disk.bodies import (
    READ_AHEAD,
    REPAIR_RETRY_SECONDS,
    REPAIR_TIMEOUT,
    TAG_GROUPS,
    Bodies,
    tag_id,
    untag_id,
)
from raftmq.store.disk.body_cache import BodyCache
from raftmq.store.disk.body_fetch import PEER_REQUEST, fetch_intact
from raftmq.store.disk.body_reader import BodyReader

log = logging.getLogger(__name__)

#: The least carry credit (module docstring), whatever ``write_buffer_high`` says.
CARRY_MIN = 2 << 20
#: After reading from a worker's store, its pages are dropped from the main process's page tables
#: this much later (store/disk/body_reader.py ``drop_pages``): at most one call per period.
DROP_PAGES_AFTER = 0.05
#: How often credit still withheld (a stalled connection) is looked at again.
RECHECK_SECONDS = 0.05
#: The main process's read-ahead of one group's bodies (bodies taken when sent: a small bound).
CACHE_BYTES = 8 << 20
#: What one read of references reads ahead, at most (and at most READ_AHEAD bodies): the pages of
#: the worker's store it touches stay mapped in the main process (VmRSS) until the kernel reclaims them.
READ_AHEAD_BYTES = 2 << 20

CREDIT = "k"  # link frame main -> worker: {conn: carried bytes handed back}
REPAIR = "b"  # link frame main -> worker: ids of bodies the main process found damaged

#: Intact copies of a group's damaged bodies from its members: (ids, expected CRC of an id) -> bodies.
Repairer = Callable[[list[int], Callable[[int], int | None]], dict[int, bytes]]


def carry_bytes(write_buffer_high: int) -> int:
    """Carried bodies of held deliveries one connection may have outstanding per group: four times
    its write buffer's high-water mark (what a front end writes before it parks), at least
    CARRY_MIN; handed back once the connection holds less than a quarter of it."""
    return max(CARRY_MIN, 4 * write_buffer_high)


def held_message(out: tuple) -> Any:
    """The message of a delivery whose consumer holds it until it settles it (a 0-9-1 delivery
    without its body yet, a 1.0/0-10 transfer likewise), or None for any other output."""
    kind = out[1]
    if kind == OUT_DELIVER:
        item = out[4]
        return item[3] if len(item) == 4 else None
    if kind == OUT_TRANSFER:
        item = out[4]
        return item[4] if len(item) == 5 else None
    return None


class Carrier:
    """The worker's side: which held deliveries carry their bodies (module docstring)."""

    def __init__(self, bodies: Bodies, limit: int = CARRY_MIN) -> None:
        self.bodies = bodies
        self.limit = limit
        self.used: dict[str, int] = {}  # conn -> carried bytes not handed back yet
        self.carried = 0  # bodies carried with held deliveries
        self.referenced = 0  # held deliveries sent without their bodies
        self.spilled = 0  # bodies written early so that the main process can read them

    def prepare(self, outputs: list) -> tuple[list[int], dict[str, int]]:
        """Give held deliveries among ``outputs`` (this node's) their bodies where the credit allows
        (by the message's size: read from memory, or from the store as one group's front end would),
        in place; write the others' bodies that are only in memory to the store.  Returns the indexes
        of the deliveries sent as references and the bytes carried per connection."""
        refs: list[int] = []
        carry: list[tuple[int, Any]] = []  # (index, message) of the deliveries that carry their body
        carried: dict[str, int] = {}
        spill: list[int] = []
        used = self.used
        limit = self.limit
        bodies = self.bodies
        pending_body = bodies.pending_body
        for i, out in enumerate(outputs):
            message = held_message(out)
            if message is None:
                continue
            conn = out[0]
            have = used.get(conn, 0)
            if have + message.size <= limit:
                used[conn] = have + message.size
                carry.append((i, message))
                continue
            if pending_body(message.id) is not None:
                spill.append(message.id)
            refs.append(i)
        if carry:
            missing = [message.id for _i, message in carry if not bodies.in_memory(message.id)]
            if missing:
                bodies.read_ahead(missing)  # (one read for those only on disk)
            get = bodies.get
            for i, message in carry:
                out = outputs[i]
                conn = out[0]
                msg_id, size = message.id, message.size
                body = get(msg_id)
                if body is None:
                    # Gone, or damaged and not repaired from a member (the read tried, as one
                    # group's does): refused here (logged with its queue, counted in this group's
                    # status), sent as a reference that the main process finds so and drops unsent.
                    bodies.refused(msg_id, out[4][0] if out[1] == OUT_DELIVER else out[4][1])
                    refs.append(i)
                    used[conn] -= size
                    if not used[conn]:
                        del used[conn]
                    continue
                used[conn] += len(body) - size  # (never differs: the model's size is the body's)
                carried[conn] = carried.get(conn, 0) + len(body)
                outputs[i] = (conn, out[1], out[2], out[3], (*out[4], body))
                self.carried += 1
        if spill:
            self.spilled += bodies.spill(spill)
        self.referenced += len(refs)
        return sorted(refs), carried

    def returned(self, credit: dict[str, int]) -> None:
        """The main process handed carried bytes back (frame ``k``)."""
        used = self.used
        for conn, n in credit.items():
            left = used.get(conn, 0) - n
            if left > 0:
                used[conn] = left
            else:
                used.pop(conn, None)


class GroupBodies:
    """The main process's side: queue groups' bodies for the front ends (``Bodies.remote``), and
    the carry credit handed back to the workers (module docstring)."""

    def __init__(self, paths: dict[int, tuple[str, str | None]], endpoint: Callable[[str], Any],
                 send: Callable[[int, tuple], None], carry: int = CARRY_MIN,
                 cache_bytes: int = CACHE_BYTES, repairers: dict[int, Repairer] | None = None) -> None:
        """``paths``: per queue group, its body store and (a single node) its durable store;
        ``endpoint(conn)``: the node's connection of that id, or None; ``send(group, item)``: a
        link frame to the group's worker; ``carry``: the workers' carry credit (``carry_bytes``);
        ``repairers``: per group, a fetch of intact copies from its members (none on a single node)."""
        self._paths = paths
        self.return_below = carry // 4  # a connection holding less gets its carried bytes back
        self._drop_timer: Any = None
        self._endpoint = endpoint
        self._send = send
        self._cache_bytes = cache_bytes
        self.readers: dict[int, BodyReader] = {}
        self.caches: dict[int, BodyCache] = {}
        self.outstanding: dict[int, dict[str, int]] = {}  # group -> conn -> carried bytes held back
        self._unit: dict[int, int] = {}  # group -> size of the last body read (read-ahead's count)
        self.gone = 0  # deliveries whose message was gone when sent (dropped unsent)
        self.refused = 0  # deliveries not sent: their body was damaged here
        self.repaired = 0  # damaged bodies replaced by a member's copy before they were sent
        self._repairers = repairers or {}
        self._repair_after = 0.0  # monotonic: no member is asked before (as Bodies.repair)
        self._damaged: list[int] = []

    # ------------------------------------------------------------------ from the workers

    def received(self, group: int, outputs: list, refs: Iterable[int], carried: dict[str, int]) -> None:
        """A worker's outputs, before they are dispatched: its references get tagged ids (on the
        main process's own copies of the messages), its carried bytes are counted."""
        for i in refs:
            message = held_message(outputs[i])
            if message.id >= 0:  # (one message may be delivered twice in a frame: tagged once)
                message.id = tag_id(group, message.id)
        if carried:
            held = self.outstanding.setdefault(group, {})
            for conn, n in carried.items():
                held[conn] = held.get(conn, 0) + n

    def settle(self) -> bool:
        """Hand carried bytes back for connections that hold little (or are gone); whether some
        are still held back (then look again in ``RECHECK_SECONDS``)."""
        endpoint_of = self._endpoint
        waiting = False
        for group, held in self.outstanding.items():
            if not held:
                continue
            give = {}
            for conn, n in held.items():
                endpoint = endpoint_of(conn)
                held_bytes = getattr(endpoint, "held_bytes", None) if endpoint is not None else None
                if held_bytes is None or held_bytes() < self.return_below:
                    give[conn] = n
            for conn in give:
                del held[conn]
            if held:
                waiting = True
            if give:
                self._send(group, (CREDIT, give))
        return waiting

    # ------------------------------------------------------------------ reads for the front ends

    def _reader(self, group: int) -> BodyReader | None:
        reader = self.readers.get(group)
        if reader is None:
            paths = self._paths.get(group)
            if paths is None:
                return None
            reader = self.readers[group] = BodyReader(*paths)
        return reader

    def _cache(self, group: int, reader: BodyReader) -> BodyCache:
        cache = self.caches.get(group)
        if cache is None:
            def load(ids: Iterable[int]) -> dict[int, bytes]:
                return reader.get_many(ids, self._damaged)

            cache = self.caches[group] = BodyCache(self._cache_bytes, load)
        return cache

    def for_send(self, tagged: int, following: Callable[[], Iterable[int]] | None,
                 qid: int | None) -> bytes | None:
        """The body of a queue group's delivery the front end writes now (``Bodies.for_send``),
        read with the next ones of the same group (``following``) when it is not read ahead yet;
        None: gone, or damaged (refused, the worker asked to repair it), and not sent."""
        group, msg_id = untag_id(tagged)
        reader = self._reader(group)
        if reader is None:
            return None
        cache = self._cache(group, reader)
        body = cache.take(msg_id)
        if body is None:
            if following is not None:
                # as many of the next ones of this group as READ_AHEAD_BYTES hold at the last size read
                # (a read-ahead reads all it asks for before the cache keeps what fits)
                room = min(READ_AHEAD, min(READ_AHEAD_BYTES, self._cache_bytes) // max(1, self._unit.get(group, 1)) - 1)
                ahead = [untag_id(i)[1] for i in following() if i < 0 and -i % TAG_GROUPS == group]
                cache.read_ahead([msg_id, *ahead[:max(0, room)]])
                body = cache.take(msg_id)
            if body is None and msg_id not in self._damaged:
                body = reader.get_many((msg_id,), self._damaged).get(msg_id)
        if body is None and msg_id in self._damaged:
            body = self._repair(group, msg_id, reader)
        if body is not None:
            self._unit[group] = len(body)
        else:
            if msg_id in self._damaged:
                self.refused += 1
                log.error("message %d of queue group %d: its body is damaged on this node: not delivered "
                          "(it stays held, not acked); the group's worker is asked to repair it", msg_id, group)
                self._send(group, (REPAIR, list(self._damaged)))
            else:
                self.gone += 1
                log.info("message %d of queue group %d was gone when its delivery was to be sent: not sent",
                         msg_id, group)
        self._damaged.clear()
        if reader.mapped:
            self._drop_later(reader)
        return body

    def _drop_later(self, reader: BodyReader) -> None:
        """``reader.drop_pages`` in DROP_PAGES_AFTER (at once without a running loop)."""
        if self._drop_timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            reader.drop_pages()
            return

        def drop() -> None:
            self._drop_timer = None
            for each in self.readers.values():
                if each.mapped:
                    each.drop_pages()

        self._drop_timer = loop.call_later(DROP_PAGES_AFTER, drop)

    def _repair(self, group: int, msg_id: int, reader: BodyReader) -> bytes | None:
        """An intact copy of a damaged body from the group's members, the delivery waiting (as one
        group's read waits, store/disk/bodies.py ``Bodies.repair``); the worker is told to replace
        its own copy.  None: no member had it (or one failed lately: REPAIR_RETRY_SECONDS)."""
        repair = self._repairers.get(group)
        if repair is None or time.monotonic() < self._repair_after:
            return None
        try:
            body = repair([msg_id], reader.expected_crc).get(msg_id)
        except Exception:  # a member answering nonsense must not break the send: refused
            log.exception("repairing message %d of queue group %d failed", msg_id, group)
            body = None
        if body is None:
            self._repair_after = time.monotonic() + REPAIR_RETRY_SECONDS
            return None
        self.repaired += 1
        log.warning("message %d of queue group %d: damaged body replaced by a member's copy", msg_id, group)
        self._send(group, (REPAIR, [msg_id]))
        return body

    @property
    def held_bytes(self) -> int:
        return sum(cache.bytes for cache in self.caches.values())

    def close(self) -> None:
        if self._drop_timer is not None:
            self._drop_timer.cancel()
        for reader in self.readers.values():
            reader.close()


def group_repairers(config: Any) -> dict[int, Repairer]:
    """Per queue group, a fetch of intact bodies from the group's other members over their Raft
    ports (each group's on its own port step: ``Config.for_group``), as a worker's own repairer
    asks them (store/applier.py); none on a single node."""
    if not config.clustered:
        return {}
    repairers: dict[int, Repairer] = {}
    for group in range(1, config.raft_groups):
        partners = [m.raft for m in config.for_group(group).cluster if m.node_id != config.node_id]
        askers = [peer_requests.ask(config.secret(), address, PEER_REQUEST, REPAIR_TIMEOUT) for address in partners]

        def repair(ids: list[int], expected: Callable[[int], int | None], askers: list = askers) -> dict[int, bytes]:
            return fetch_intact(ids, askers, expected)

        repairers[group] = repair
    return repairers


def link_bodies_status(broker: Any) -> dict:
    """status.json's figures of bodies across the link: a worker's (carried, sent as references,
    written early), the main process's (read from the workers' stores, held for sends, gone or
    refused when sent, carried bytes whose credit it holds back); nothing with one group."""
    carrier: Carrier | None = getattr(broker, "carrier", None)
    if carrier is not None:
        return {"link_bodies_carried": carrier.carried, "link_bodies_referenced": carrier.referenced,
                "link_bodies_spilled": carrier.spilled,
                "link_carry_outstanding_bytes": sum(carrier.used.values())}
    host = getattr(broker, "group_host", None)
    if host is None:
        return {}
    bodies: GroupBodies = host.bodies
    return {"group_bodies_read": sum(reader.reads for reader in bodies.readers.values()),
            "group_bodies_held_bytes": bodies.held_bytes, "group_bodies_gone_unsent": bodies.gone,
            "group_bodies_refused": bodies.refused, "group_bodies_repaired": bodies.repaired,
            "group_carry_held_back_bytes": sum(sum(held.values()) for held in bodies.outstanding.values())}
