"""Bodies of queue groups' deliveries across the link to the workers (issue 34; node/group_bodies.py,
docs/design.md "Bodies across the link"), on one node with three groups and real pika clients.

A queue group's worker applies deliveries in its own process; the node's main process holds the
client connections.  A delivery whose consumer holds its message until it acks it (AMQP 0-9-1
manual acknowledgement, spec 1.8.3.13 basic.ack: the message stays unacked, held for the consumer)
crosses the link with its body only within a bounded carry credit per connection; beyond it the main
process reads the body from the worker's body store (or, on a single node, its durable store's
records) when it writes the delivery.  So the main process's memory stays bounded whatever backlog a
consumer is assigned, as it is with one group.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pika
import pytest

from tests.support.groups import channel

MiB = 1 << 20
BODY = MiB
RSS_BOUND = 24 * MiB  # what the main process may grow by while the backlogs below are sent


@pytest.fixture
def node(groups_node):
    return groups_node


def rss_anon(pid: int) -> int:
    """The process's resident anonymous memory (its heap; not the pages of the workers' LMDB files
    it maps to read bodies, which the kernel may reclaim)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def body_of(i: int) -> bytes:
    stamp = f"{i:08d}".encode()
    return (stamp * (BODY // len(stamp) + 1))[:BODY]


def status(node, group: int = 0) -> dict:
    where = Path(node.data_dir) / ("status.json" if group == 0 else f"groups/g{group}/status.json")
    return json.loads(where.read_text())


def fill(ch, queue: str, count: int, persistent: bool) -> None:
    props = pika.BasicProperties(delivery_mode=2 if persistent else 1)
    for i in range(count):
        ch.basic_publish("", queue, body_of(i), props)


def test_a_backlog_in_queue_groups_is_sent_from_disk_and_the_main_process_stays_bounded(node):
    """Two backlogs of 1 MiB messages: 48 transient ones in a queue of group 2 (more than the
    worker's 16 MiB write-behind: most are in its body store) and 32 persistent ones in a durable
    queue of group 1 (a single node keeps them in the worker's durable store's records).

    1. A manual-ack consumer without prefetch (basic.consume, no basic.qos: the core assigns it the
       whole persistent backlog in one apply) whose client does not read for 2 s: the main
       process's heap grows by less than 24 MiB (before: every body crossed the link with its
       delivery: +65 MiB measured), then the client reads and gets all 32 intact and in order,
       acking each.
    2. A consumer with prefetch 2 (basic.qos) drains the transient backlog: intact, in order, the
       heap again within the bound.
    3. The main process read bodies from the workers' stores (status.json ``group_bodies_read``),
       group 1's worker sent deliveries without their bodies (``link_bodies_referenced``), no
       delivery was dropped as gone or refused, and both queues are empty (every message acked once)."""
    conn, ch = channel(node)
    ch.confirm_delivery()
    ch.queue_declare("gb-tr", arguments={"x-queue-group": 2})
    ch.queue_declare("gb-ps", durable=True, arguments={"x-queue-group": 1})
    fill(ch, "gb-tr", 48, persistent=False)
    fill(ch, "gb-ps", 32, persistent=True)
    assert ch.queue_declare("gb-tr", passive=True).method.message_count == 48
    assert ch.queue_declare("gb-ps", passive=True).method.message_count == 32
    time.sleep(0.5)
    before = rss_anon(node.pid)

    # 1. no prefetch, a client that stops reading
    stalled, sch = channel(node)
    got: list[tuple[int, bytes]] = []
    sch.basic_consume("gb-ps", lambda c, m, p, body: got.append((m.delivery_tag, body)), auto_ack=False)
    peak = before
    end = time.monotonic() + 2.0
    while time.monotonic() < end:  # pika reads nothing while its connection is not driven
        peak = max(peak, rss_anon(node.pid))
        time.sleep(0.05)
    grown = peak - before
    print(f"\nstalled consumer on 32 MiB: main process heap +{grown / MiB:.1f} MiB")
    assert grown < RSS_BOUND, f"the main process grew {grown / MiB:.0f} MiB for a stalled consumer"
    deadline = time.monotonic() + 60
    acked = 0
    while len(got) < 32 and time.monotonic() < deadline:
        stalled.process_data_events(time_limit=0.2)
        peak = max(peak, rss_anon(node.pid))
        for tag, _body in got[acked:]:
            sch.basic_ack(tag)
        acked = len(got)
    bodies = [body for _, body in got]
    assert len(bodies) == 32, f"only {len(bodies)} of 32 deliveries"
    assert bodies == [body_of(i) for i in range(32)], "every message intact, once, in order"
    stalled.close()

    # 2. prefetch 2
    ch.basic_qos(prefetch_count=2)
    drained = []
    for method, _props, body in ch.consume("gb-tr", auto_ack=False, inactivity_timeout=10):
        assert method is not None, f"only {len(drained)} of 48 deliveries"
        drained.append(body)
        ch.basic_ack(method.delivery_tag)
        peak = max(peak, rss_anon(node.pid))
        if len(drained) == 48:
            break
    ch.cancel()
    assert drained == [body_of(i) for i in range(48)]
    grown = peak - before
    print(f"both backlogs sent: main process heap peak +{grown / MiB:.1f} MiB")
    assert grown < RSS_BOUND, f"the main process grew {grown / MiB:.0f} MiB"

    # 3. where the bodies came from
    assert ch.queue_declare("gb-tr", passive=True).method.message_count == 0
    assert ch.queue_declare("gb-ps", passive=True).method.message_count == 0
    conn.close()
    time.sleep(0.6)  # a status file written after the last send
    main, g1, g2 = status(node), status(node, 1), status(node, 2)
    print({k: v for k, v in main.items() if k.startswith("group_bodies") or k.startswith("group_carry")},
          {k: v for k, v in g1.items() if k.startswith("link_")}, {k: v for k, v in g2.items() if k.startswith("link_")})
    assert main["group_bodies_read"] > 0
    assert g1["link_bodies_referenced"] > 0
    assert main["group_bodies_gone_unsent"] == 0 and main["group_bodies_refused"] == 0
