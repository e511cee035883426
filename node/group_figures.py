"""Queue figures from the queue groups (issue 34): the main process's reads of a queue placed in a
queue group.

The main process applies the metadata group only, where a queue of queue group ``g`` is a *stub*
(store/core/groups.py: its name, arguments and bindings, no messages, consumers or counts).  The
HTTP API (/api/queues, /api/overview's totals), the admin service and the CLI read the main
process's machine, so with groups they showed every queue of a queue group empty.

Why ask, and not have the workers push their figures: a client that was confirmed a publish (or
whose ack was applied) expects /api/queues on the same node to show it at once (the tests, and
RabbitMQ, behave so: its management API reads each queue's process).  A worker sends the outputs
of an entry after applying it, so a question asked after the confirm and answered by the worker
sees it; a periodic push would be up to a period late, and would cost a scan of every queue every
period whether anyone looks or not.  A question costs one frame each way per worker, only when an
operator or a tool asks.

The link's frames for this (new kinds, beside the command/output ones of node/group_link.py):
``("f?", ask_id, qids, what)`` main -> worker, and ``("f", ask_id, {qid: value})`` worker -> main,
``what`` being ``FIGURES`` (a queue's Figures) or ``CONSUMERS`` (its consumers, for /api/consumers,
consumer_details and the admin service: consumers live in their queue's group too).
``qids`` None means every queue placed in the worker's group.  A worker that does not answer
within :data:`ASK_TIMEOUT` leaves its queues' stub figures (zeros), with a log line: a read must
not hang on a busy worker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from raftmq.store.core import queries as Q

if TYPE_CHECKING:
    from raftmq.store.core.machine import StateMachine
    from raftmq.store.core.model import Queue
    from raftmq.store.core.queries import ConsumerInfo, QueueDepth, QueueInfo, VhostInfo

log = logging.getLogger(__name__)

ASK = "f?"
ANSWER = "f"
FIGURES = "q"  # what an ask wants: Figures per queue
CONSUMERS = "c"  # or the queues' consumers (ConsumerInfo)
STATS = "s"  # or the group's message counters and body figures ({group: (stats, bodies)}, metrics)
ASK_TIMEOUT = 2.0  # seconds


class Figures(NamedTuple):
    """A queue's numbers in its own group's machine (the fields of QueueInfo that a stub lacks)."""

    messages_ready: int
    messages_unacknowledged: int
    message_bytes_ready: int
    consumers: int
    published: int
    delivered: int  # deliveries and gets since this node's worker started applying (queue_counts)
    acked: int


def figures_of(m: StateMachine, qids: Iterable[int] | None) -> dict[int, Figures]:
    """The worker's side: the figures of the queues placed in its group (``qids`` None: all of them)."""
    out: dict[int, Figures] = {}
    for q in _placed_here(m, qids):
        counts = m.queue_counts.get(q.qid) or (0, 0)
        out[q.qid] = Figures(len(q.ready), q.unacked_count, q.ready_bytes, len(q.consumers), q.next_seq - 1,
                             counts[0], counts[1])
    return out


def _placed_here(m: StateMachine, qids: Iterable[int] | None) -> Iterator[Queue]:
    group = m.group
    by_id = m.queues_by_id
    for qid in (list(by_id) if qids is None else qids):
        q = by_id.get(qid)
        if q is not None and q.group == group:
            yield q


def answer(m: StateMachine, what: str, qids: Iterable[int] | None) -> dict[int, Any]:
    """The worker's answer to an ask, as plain tuples for the link: ``FIGURES`` qid -> Figures'
    fields, ``CONSUMERS`` qid -> its consumers' ConsumerInfo fields."""
    if what == CONSUMERS:
        return {q.qid: [tuple(c) for c in Q.consumers(m, q.vhost, q.name)] for q in _placed_here(m, qids)}
    return {qid: tuple(f) for qid, f in figures_of(m, qids).items()}


class FigureAsker:
    """The main process's side: ask the workers, gather their answers by ask id."""

    def __init__(self, senders: Callable[[], dict[int, Callable[[Any], None]]]) -> None:
        """``senders``: group -> its link's send, of the workers running now."""
        self._senders = senders
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.Future, dict[int, Any], set[int], str]] = {}

    async def ask(self, placed: dict[int, list[int]] | None = None, what: str = FIGURES) -> dict[int, Any]:
        """The figures (or consumers, ``what``) of queues of queue groups: ``placed`` group -> qids,
        or None for every queue of every queue group.  Groups that do not answer in time are left out."""
        senders = self._senders()
        groups = sorted(senders) if placed is None else sorted(g for g in placed if g in senders and placed[g])
        if not groups:
            return {}
        ask_id = next(self._ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        found: dict[int, Any] = {}
        self._waiting[ask_id] = (future, found, set(groups), what)
        for group in groups:
            senders[group]((ASK, ask_id, None if placed is None else placed[group], what))
        try:
            await asyncio.wait_for(asyncio.shield(future), ASK_TIMEOUT)
        except TimeoutError:
            log.warning("queue figures: no answer from groups %s within %.1fs; their queues show stub figures",
                        sorted(self._waiting[ask_id][2]) if ask_id in self._waiting else [], ASK_TIMEOUT)
        finally:
            self._waiting.pop(ask_id, None)
        return found

    def answered(self, group: int, ask_id: int, values: dict[int, Any]) -> None:
        """A worker's answer (the ``"f"`` frame: plain tuples on the link)."""
        waiting = self._waiting.get(ask_id)
        if waiting is None:
            return  # timed out already
        future, found, missing, what = waiting
        if what == CONSUMERS:
            found.update((qid, [Q.ConsumerInfo(*c) for c in rows]) for qid, rows in values.items())
        elif what == STATS:
            found.update(values)
        else:
            found.update((qid, Figures(*f)) for qid, f in values.items())
        missing.discard(group)
        if not missing and not future.done():
            future.set_result(None)


def placed_in_groups(m: StateMachine, qids: Iterable[int]) -> dict[int, list[int]]:
    """Group -> the given queues placed there (queue groups only: group 0's are the main process's)."""
    out: dict[int, list[int]] = {}
    by_id = m.queues_by_id
    for qid in qids:
        q = by_id.get(qid)
        if q is not None and q.group:
            out.setdefault(q.group, []).append(qid)
    return out


def with_figures(info: QueueInfo, figures: Figures | None) -> QueueInfo:
    """A QueueInfo with its group's figures in place of the stub's."""
    if figures is None:
        return info
    return info._replace(messages_ready=figures.messages_ready,
                         messages_unacknowledged=figures.messages_unacknowledged,
                         message_bytes_ready=figures.message_bytes_ready, consumers=figures.consumers,
                         published=figures.published)


def depth_with_figures(depth: QueueDepth, figures: Figures | None) -> QueueDepth:
    if figures is None:
        return depth
    return depth._replace(messages_ready=figures.messages_ready,
                          messages_unacknowledged=figures.messages_unacknowledged,
                          consumers=figures.consumers, published=figures.published)


async def queue_infos(broker: Any, infos: list[QueueInfo]) -> tuple[list[QueueInfo], dict[int, Figures]]:
    """``infos`` (read from the main process's machine) with the figures of the queues placed in
    queue groups asked from their workers, and those figures by qid (for the counts QueueInfo
    lacks).  One group (``broker.group_host`` None): ``infos`` as they are, at no cost."""
    host = broker.group_host
    if host is None:
        return infos, {}
    placed = placed_in_groups(broker.machine, (q.qid for q in infos))
    if not placed:
        return infos, {}
    figures = await host.figures.ask(placed)
    return [with_figures(q, figures.get(q.qid)) for q in infos], figures


async def vhost_infos(broker: Any, infos: list[VhostInfo]) -> list[VhostInfo]:
    """``infos`` with the messages and consumers of the queues of queue groups added (the stubs in
    the main process's machine count none): /api/overview's queue_totals, /api/vhosts.  One
    group: ``infos`` as they are."""
    host = broker.group_host
    if host is None or not infos:
        return infos
    figures = await host.figures.ask(None)
    if not figures:
        return infos
    by_id = broker.machine.queues_by_id
    added: dict[str, list[int]] = {}
    for qid, f in figures.items():
        q = by_id.get(qid)
        if q is not None:
            sums = added.setdefault(q.vhost, [0, 0, 0])
            sums[0] += f.messages_ready
            sums[1] += f.messages_unacknowledged
            sums[2] += f.consumers
    out = []
    for v in infos:
        more = added.get(v.name)
        if more is not None:
            v = v._replace(messages_ready=v.messages_ready + more[0],
                           messages_unacknowledged=v.messages_unacknowledged + more[1],
                           consumers=v.consumers + more[2])
        out.append(v)
    return out


async def consumer_infos(broker: Any, vhost: str | None = None, queue: str | None = None) -> list[ConsumerInfo]:
    """``queries.consumers`` (of every vhost, one vhost, one queue) with the consumers of queues of
    queue groups asked from their workers (their stubs here have none).  One group: the query."""
    rows = list(Q.consumers(broker.machine, vhost, queue))
    host = broker.group_host
    if host is None:
        return rows
    m = broker.machine
    if queue is not None and vhost is not None:
        one = m.vhosts.get(vhost)
        q = one.queues.get(queue) if one is not None else None
        placed = placed_in_groups(m, [q.qid]) if q is not None else {}
    else:
        placed = placed_in_groups(m, (q.qid for q in m.queues_by_id.values() if vhost is None or q.vhost == vhost))
    if not placed:
        return rows
    asked = await host.figures.ask(placed, CONSUMERS)
    for qid in sorted(asked):
        rows.extend(asked[qid])
    return rows


async def node_totals(broker: Any, stats: dict[str, int], bodies: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """The node's message counters (``stats``, queries.message_stats) and body figures (``bodies``,
    node/status.py bodies_status) of the main process, with every worker's added: each process
    counts what its group applied and holds its own body store (a publish routed to queues of k
    groups is applied, and counted as published, by each of them).  One group: as given."""
    host = broker.group_host
    if host is None:
        return stats, bodies
    stats, bodies = dict(stats), dict(bodies)
    for worker_stats, worker_bodies, *_rest in (await host.figures.ask(None, STATS)).values():
        for key, value in worker_stats.items():
            stats[key] = stats.get(key, 0) + value
        for key, value in worker_bodies.items():
            bodies[key] = bodies.get(key, 0) + value
    return stats, bodies


async def held_totals(broker: Any, stats: dict[str, int],
                      dedup: list[tuple[str, str, int]]) -> tuple[dict[str, int], list[tuple[str, str, int]]]:
    """The node's message counters summed over every group's process (as :func:`node_totals`), and
    ``dedup`` (queries.dedup_queues of the main process: a queue group's queue is a stub there, its
    cache empty) with the entries of each queue's own group.  One group: as given."""
    host = broker.group_host
    if host is None:
        return stats, dedup
    stats = dict(stats)
    theirs: dict[tuple[str, str], int] = {}
    for worker_stats, _bodies, *rest in (await host.figures.ask(None, STATS)).values():
        for key, value in worker_stats.items():
            stats[key] = stats.get(key, 0) + value
        for vhost, name, entries in (rest[0] if rest else []):
            theirs[(vhost, name)] = entries
    return stats, [(v, n, theirs.get((v, n), e)) for v, n, e in dedup]
