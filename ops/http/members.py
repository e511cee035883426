"""What only each member knows, gathered for the management API (issue 35): its client connections
and channels, its own Raft indexes, the snapshots it wrote or loaded, and its state digest.

A client is connected to one node, and a node knows its own commit and applied index; RabbitMQ's
/api/connections and /api/channels list every node's, so the node asked gathers them.  Members ask
each other over the Raft port (raft/peer_requests.py, request name ``PEER_REQUEST``: the same
authenticated, encrypted transport as the body fetch, no new port, and no need to know the other
members' HTTP ports, which the replicated member list does not hold).

Every member answers (a service of its own, ops/services.py, whether or not it serves HTTP); the
HTTP API's instance only asks.

**Never block the Raft thread.**  pysyncobj calls a request's handler in its tick thread, whose
election timeout is 0.25-0.5 s, and the broker's state belongs to the event loop.  So the handler
never builds anything: it answers the last view the loop built (``_blob``, bytes, swapped whole)
with its age, and asks the loop to keep building one every ``REFRESH`` seconds for the next
``WANTED_FOR`` seconds.  The asker takes an answer older than ``STALE`` (a member nobody asked for a
while) as a wake-up and asks once more a moment later.  While nobody looks, nothing is built.

**Digests** (``state_digest``, node/status.py: the model and the bodies, as ``digest.json``) walk
the whole model on the loop, so they are made only when asked (the Cluster page's button, GET
/api/raftmq/digests) and at most once per ``DIGEST_EVERY`` seconds per node; the asker waits (up to
``DIGEST_WAIT``) for a digest made after it asked.  Digests compare only at equal applied indexes:
the page says which were made at the same index.

Askers run in the loop's default executor (a request is a blocking socket exchange), every member
at once, each bounded by ``ASK_TIMEOUT``; a member that does not answer is reported by name
(``missing``), and its rows are absent.  The other members' answers are kept ``CACHE_FOR`` seconds
and concurrent requests share one round, so a room full of open browser tabs costs the members one
request per second each at most; this node's own rows are always read fresh.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftmq.node.status import state_digest
from raftmq.raft.peer_requests import ask
from raftmq.store.core import queries as Q

from ..control import AdminEndpoint
from .views import node_name

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

log = logging.getLogger(__name__)

PEER_REQUEST = "mgmt-view"  # the request's name on the Raft port
REFRESH = 1.0  # seconds between views while someone asks
WANTED_FOR = 30.0  # seconds views are still built after the last request
STALE = 3.0  # an answer older than this is asked again once (the member had stopped building)
ASK_AGAIN_AFTER = 0.3
ASK_TIMEOUT = 2.0  # per request (pysyncobj's utility connection: connect, authenticate, answer)
CACHE_FOR = 1.0
DIGEST_EVERY = 5.0
DIGEST_WAIT = 8.0  # > DIGEST_EVERY: a member that made one just before we asked makes the next


# ------------------------------------------------------------------ this node's rows


def connection_name(endpoint: Any, config: Any) -> str:
    return f"{getattr(endpoint, 'peer', '?')} -> {config.host}:{config.port}"


def client_endpoints(broker: Broker) -> list[tuple[str, Any]]:
    """This node's client connections (the admin's pseudo-connection and unauthenticated ones left out)."""
    return [(conn_id, endpoint) for conn_id, endpoint in list(broker.endpoints.items())
            if not isinstance(endpoint, AdminEndpoint) and getattr(endpoint, "principal", None) is not None]


def connection_view(broker: Broker, conn_id: str, endpoint: Any) -> dict:
    """A connection as RabbitMQ's /api/connections writes it."""
    config = broker.config
    peer_host, _, peer_port = getattr(endpoint, "peer", "?:0").rpartition(":")
    protocol = getattr(endpoint, "PROTOCOL", None) or (
        "AMQP 0-10" if type(endpoint).__name__.startswith("Amqp010") else "AMQP 0-9-1")
    return {
        "name": connection_name(endpoint, config),
        "node": node_name(broker),
        "user": endpoint.principal.name,
        "vhost": getattr(endpoint, "vhost", "/"),
        "protocol": protocol,
        "type": "network",
        "state": "running",
        "host": config.host,
        "port": config.port,
        "peer_host": peer_host,
        "peer_port": int(peer_port) if peer_port.isdigit() else 0,
        "ssl": endpoint.transport.get_extra_info("ssl_object") is not None if hasattr(endpoint, "transport") else False,
        "channels": Q.channel_count(broker.machine, conn_id),
        "timeout": getattr(endpoint, "heartbeat", 0),
        "frame_max": getattr(endpoint, "frame_max", 0),
        "channel_max": getattr(endpoint, "channel_max", 0),
        "client_properties": getattr(endpoint, "client_properties", {}) or {},
        "raftmq_id": conn_id,
    }


def channel_rows(broker: Broker, endpoints: list[tuple[str, Any]]) -> list[dict]:
    """The channels of ``endpoints`` as RabbitMQ's /api/channels writes them."""
    rows = []
    for conn_id, endpoint in endpoints:
        name = connection_name(endpoint, broker.config)
        peer_host, _, peer_port = getattr(endpoint, "peer", "?:0").rpartition(":")
        front = getattr(endpoint, "channels", None) if broker.group_host is not None else None
        for ch in Q.channels(broker.machine, conn_id):
            if front is not None:  # issue 34: consumers of queue groups' queues are not in the view
                counted = getattr(front.get(ch.number), "consumer_count", None)
                if counted is not None:
                    ch = ch._replace(consumers=max(ch.consumers, counted))
            rows.append({
                "name": f"{name} ({ch.number})",
                "number": ch.number,
                "node": node_name(broker),
                "user": endpoint.principal.name,
                "vhost": getattr(endpoint, "vhost", "/"),
                "state": "running" if ch.active else "flow",
                "consumer_count": ch.consumers,
                "messages_unacknowledged": ch.messages_unacknowledged,
                "prefetch_count": ch.consumer_prefetch,
                "global_prefetch_count": ch.prefetch_count,
                "connection_details": {"name": name, "peer_host": peer_host,
                                       "peer_port": int(peer_port) if peer_port.isdigit() else 0},
            })
    return rows


def raft_view(broker: Broker) -> dict:
    """This node's own Raft numbers (what only it knows) and the snapshots it wrote or loaded."""
    raft = broker.log.raft_status()
    if raft is None:
        applied = Q.counters(broker.machine).applied_index
        return {"role": "single", "term": 0, "commit_index": applied, "applied_index": applied,
                "journal_entries": 0, "snapshots": []}
    return {
        "role": "leader" if broker.log.is_leader else "follower",
        "term": raft.term,
        "commit_index": raft.commit_index,
        "applied_index": raft.applied_index,
        "journal_entries": raft.journal_entries,
        "snapshots": [{"time": int(at * 1000), "index": index, "bytes": size, "how": how}
                      for at, index, size, how in reversed(raft.snapshots)],
    }


def local_view(broker: Broker) -> dict:
    """Everything one member tells the others (every connection: the asker filters by its user)."""
    endpoints = client_endpoints(broker)
    return {"node": node_name(broker),
            "connections": [connection_view(broker, c, e) for c, e in endpoints],
            "channels": channel_rows(broker, endpoints),
            "raft": raft_view(broker)}


# ------------------------------------------------------------------ serving and asking


@dataclass
class Gathered:
    """Every member's view (by node name, this node's included) and the members that did not answer."""

    views: dict[str, dict] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    at: float = 0.0  # monotonic time it was gathered

    def rows(self, kind: str) -> list[dict]:
        return [row for view in self.views.values() for row in view.get(kind, ())]


class MemberViews:
    """This node's answers to the other members, and its questions to them (module docstring)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._loop: asyncio.AbstractEventLoop | None = None
        # (bytes of the last view, monotonic time it was built): one attribute, swapped whole,
        # because the Raft thread reads it.
        self._blob: tuple[bytes, float] | None = None
        self._asked = 0.0  # monotonic time of the last request (written by the Raft thread)
        self._digest_asked = 0.0
        self._digest: tuple[dict, float] | None = None  # (state_digest, monotonic time made)
        self._building = False
        self._cache: Gathered | None = None
        self._round: asyncio.Future[Gathered] | None = None
        self._digest_round: asyncio.Future[Gathered] | None = None

    # -- serving (this node answers)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answer the other members' requests (a cluster only: a single node has no Raft port)."""
        serve = getattr(self.broker.log, "serve", None)
        if serve is None or self.broker.log.raft_status() is None:
            return
        self._loop = loop
        serve(PEER_REQUEST, self._answer)

    def _answer(self, request: bytes) -> bytes:
        """In pysyncobj's tick thread: the last view and its age, never built here."""
        now = time.monotonic()
        self._asked = now
        try:
            if json.loads(request).get("digest"):
                self._digest_asked = now
        except ValueError:
            pass
        blob = self._blob
        if not self._building and self._loop is not None:
            self._building = True
            self._loop.call_soon_threadsafe(self._build)
        if blob is None:
            return b'{"age": null, "view": null}'
        data, built = blob
        return b'{"age": %.3f, "view": %s}' % (now - built, data)

    def _build(self) -> None:
        """On the loop: build this node's view; again every REFRESH seconds while it is asked for."""
        now = time.monotonic()
        if now - self._asked > WANTED_FOR:
            self._building = False
            self._blob = None  # a view nobody asked for in a while is not worth answering
            return
        view = local_view(self.broker)
        if self._digest_asked and (self._digest is None or (self._digest_asked > self._digest[1]
                                                            and now - self._digest[1] >= DIGEST_EVERY)):
            self._digest = (self._state_digest(), time.monotonic())
        if self._digest is not None:
            view["digest"] = {**self._digest[0], "age": round(time.monotonic() - self._digest[1], 3)}
        self._blob = (json.dumps(view, default=str).encode(), time.monotonic())
        assert self._loop is not None
        self._loop.call_later(REFRESH, self._build)

    def _state_digest(self) -> dict:
        return state_digest(self.broker)  # on the loop: it walks the whole model

    # -- asking (this node gathers)

    async def gather(self) -> Gathered:
        """Every member's view: this node's built now, the others' asked (kept CACHE_FOR s)."""
        own = local_view(self.broker)
        own["age"] = 0.0
        remote = await self._remote()
        return Gathered({own["node"]: own, **remote.views}, remote.missing, remote.at)

    async def _remote(self) -> Gathered:
        """The other members' views, one round at a time, kept CACHE_FOR seconds."""
        cached = self._cache
        if cached is not None and time.monotonic() - cached.at < CACHE_FOR:
            return cached
        if self._round is not None and not self._round.done():
            return await asyncio.shield(self._round)
        self._round = asyncio.get_running_loop().create_future()
        try:
            gathered = await self._ask_others(digest=False)
        except BaseException as exc:
            self._round.set_exception(exc)
            self._round.exception()  # (retrieved: a round nobody else awaited logs nothing)
            raise
        self._cache = gathered
        self._round.set_result(gathered)
        return gathered

    async def digests(self) -> Gathered:
        """Every member's view with a state digest made after this call began (this node's now).
        One round at a time: a request during a round gets that round's answer."""
        if self._digest_round is not None and not self._digest_round.done():
            return await asyncio.shield(self._digest_round)
        self._digest_round = asyncio.ensure_future(self._digests())
        return await asyncio.shield(self._digest_round)

    async def _digests(self) -> Gathered:
        asked = asyncio.ensure_future(self._ask_others(digest=True))
        own = local_view(self.broker)
        self._digest = (self._state_digest(), time.monotonic())
        own["digest"] = {**self._digest[0], "age": 0.0}
        own["age"] = 0.0
        remote = await asked
        return Gathered({own["node"]: own, **remote.views}, remote.missing, remote.at)

    async def _ask_others(self, digest: bool) -> Gathered:
        broker = self.broker
        me = broker.config.node_id
        loop = asyncio.get_running_loop()
        others = [(node_id, raft) for node_id, (raft, _amqp) in sorted(broker.members.items()) if node_id != me]
        if not others:  # a single node
            return Gathered(at=time.monotonic())
        gathered = Gathered(at=time.monotonic())
        # A member this node's Raft is not connected to would only time out (a partition: seconds
        # on every page): named missing at once.
        status = broker.log.raft_status()
        connected = set(status.connected_partners) if status is not None else set()
        unreachable = [node_id for node_id, raft in others if raft not in connected]
        gathered.missing.extend(node_name(broker, node_id) for node_id in unreachable)
        others = [(node_id, raft) for node_id, raft in others if node_id not in unreachable]
        asked = [loop.run_in_executor(None, self._ask, raft, digest) for _node_id, raft in others]
        for (node_id, _raft), answer in zip(others, await asyncio.gather(*asked, return_exceptions=True), strict=True):
            name = node_name(broker, node_id)
            if isinstance(answer, dict):
                gathered.views[name] = answer
            else:
                log.info("member %s did not answer the management view: %s", name, answer)
                gathered.missing.append(name)
        return gathered

    def _ask(self, raft_address: str, digest: bool) -> dict:
        """In a worker thread: one member's view (asked again while stale, or without a new digest)."""
        request = json.dumps({"digest": digest}).encode()
        call = ask(self.broker.config.secret(), raft_address, PEER_REQUEST, ASK_TIMEOUT)
        began = time.monotonic()
        deadline = began + (DIGEST_WAIT if digest else ASK_AGAIN_AFTER + ASK_TIMEOUT)
        while True:
            answer = json.loads(call(request))
            view, age = answer.get("view"), answer.get("age")
            fresh = view is not None and age is not None and age <= STALE
            if fresh and digest:
                made = view.get("digest")
                # made after we asked: its age at answer time is less than the time since we began
                fresh = made is not None and made["age"] + age < time.monotonic() - began
            if fresh:
                view["age"] = age
                return view
            if time.monotonic() + ASK_AGAIN_AFTER > deadline:
                if view is None:
                    raise ConnectionError(f"{raft_address} had no view ready")
                view["age"] = age
                return view  # stale, but what there is (the page shows each member's age)
            time.sleep(ASK_AGAIN_AFTER)
