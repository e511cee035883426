"""Audit jobs over a history snapshot: importable functions returning DataFrames.

Every job takes a SparkSession with the ``raftmq`` format registered (``session.audit_session``)
and a snapshot directory (``raftmq snapshot``).  A message's life in one queue is the events
sharing its ``(vhost, queue, message_id)``: ``routed`` -> ``delivered`` (maybe several times,
with ``requeued`` between) -> ``acked`` | ``rejected`` | ``expired`` | ``purged`` | ``deleted``
| ``dropped``, and ``dead_lettered`` links it to a new message whose ``published`` event's
detail is ``dead-letter:<original id>:<queue>``.

``trace`` (one message's life across queues and copies) and ``contents`` (a queue's messages at a
moment) take their own arguments; ``path`` may be a list of several nodes' snapshots, read as one
table (spark/union.py).

**Groups** (issue 34, spark/groups.py): a node with queue groups has one history per group, read
as one table with a ``group`` column.  Message ids are numbered by each group (message 7 of group 1
is not message 7 of group 2), so a message is ``(group, message_id)``: the jobs key messages by
``group`` too (``QUEUE_KEY``) and ``trace`` takes the group.  A queue's message events are all in
the group it was placed in.  Each queue group keeps the topology events (exchange/queue declared,
bound...) of the metadata group's changes it applied: ``summary`` counts them once per group
(``group = 0`` for the decisions themselves), and a publish routed to queues of k groups is
``published`` in each of them (``throughput`` counts it k times, as the node's
``raftmq_messages_published_total`` does).  A dead-lettered or delayed message moving to a queue
of another group is a new message there (``published`` with detail ``group:<source>:<seq>``, the
source group's outbox sequence): ``trace`` follows copies within one group and does not link that
hop yet (the source's history does not say which outbox sequence a copy took).
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from raftmq.store.core.events import NO_ACK

from .groups import META_GROUP, ORDER
from .session import load

QUEUE_KEY = ["group", "vhost", "queue", "message_id"]  # one message in one queue (ids are per group)
FINAL_KINDS = ("acked", "rejected", "expired", "purged", "deleted", "dropped")


def events(spark, path: str, **options) -> DataFrame:
    return load(spark, path, "events", **options)


def summary(spark, path: str) -> DataFrame:
    """Events per kind (and the time span each covers)."""
    return (events(spark, path).groupBy("kind")
            .agg(F.count("*").alias("events"), F.min("time").alias("first"), F.max("time").alias("last"))
            .orderBy(F.desc("events")))


def unconsumed(spark, path: str) -> DataFrame:
    """Messages routed to a queue and never delivered from it, with what became of them there
    (``queued`` when nothing did: still in the queue at the snapshot)."""
    # One load per scan: see "Self-joins" in datasource.py.
    routed = events(spark, path).filter(F.col("kind") == "routed").select(
        *QUEUE_KEY, F.col("time").alias("routed"), "exchange", "routing_key", "size")
    delivered = events(spark, path).filter(F.col("kind") == "delivered").select(*QUEUE_KEY).distinct()
    fates = (events(spark, path).filter(F.col("kind").isin(*FINAL_KINDS))
             .groupBy(*QUEUE_KEY).agg(F.max_by("kind", "seq").alias("fate")))
    return (routed.join(delivered, QUEUE_KEY, "left_anti")
            .join(fates, QUEUE_KEY, "left")
            .withColumn("fate", F.coalesce("fate", F.lit("queued")))
            .orderBy("vhost", "queue", "group", "message_id"))


def redelivered(spark, path: str) -> DataFrame:
    """Messages delivered more than once from the same queue."""
    return (events(spark, path).filter(F.col("kind") == "delivered")
            .groupBy(*QUEUE_KEY)
            .agg(F.count("*").alias("deliveries"), F.min("time").alias("first"), F.max("time").alias("last"))
            .filter(F.col("deliveries") > 1)
            .orderBy(F.desc("deliveries"), "vhost", "queue", "group", "message_id"))


def dead_letters(spark, path: str) -> DataFrame:
    """Dead-lettered messages per queue, reason and dead-letter exchange."""
    parts = F.split(F.col("detail"), "->")
    return (events(spark, path).filter(F.col("kind") == "dead_lettered")
            .select("vhost", "queue", parts.getItem(0).alias("reason"),
                    parts.getItem(1).alias("dead_letter_exchange"))
            .groupBy("vhost", "queue", "reason", "dead_letter_exchange").agg(F.count("*").alias("messages"))
            .orderBy(F.desc("messages")))


def latency(spark, path: str) -> DataFrame:
    """Per queue: milliseconds from routing to first delivery and to acknowledgement (p50, p90,
    p99, max) over the messages acknowledged there."""
    ev = events(spark, path)
    milestones = (ev.filter(F.col("kind").isin("routed", "delivered", "acked"))
                  .groupBy(*QUEUE_KEY)
                  .agg(F.min(F.when(F.col("kind") == "routed", F.col("time"))).alias("routed"),
                       F.min(F.when(F.col("kind") == "delivered", F.col("time"))).alias("delivered"),
                       F.max(F.when(F.col("kind") == "acked", F.col("time"))).alias("acked"))
                  .filter(F.col("routed").isNotNull() & F.col("acked").isNotNull()))

    def millis(a: str, b: str):
        return (F.unix_micros(F.col(b)) - F.unix_micros(F.col(a))) / 1000.0

    timed = milestones.select("vhost", "queue", millis("routed", "delivered").alias("to_deliver"),
                              millis("routed", "acked").alias("to_ack"))
    aggregates = [F.count("*").alias("messages")]
    for column in ("to_deliver", "to_ack"):
        quantiles = F.percentile_approx(column, [0.5, 0.9, 0.99], 10_000)
        aggregates += [quantiles.getItem(0).alias(f"{column}_p50_ms"), quantiles.getItem(1).alias(f"{column}_p90_ms"),
                       quantiles.getItem(2).alias(f"{column}_p99_ms"), F.max(column).alias(f"{column}_max_ms")]
    return timed.groupBy("vhost", "queue").agg(*aggregates).orderBy("vhost", "queue")


def throughput(spark, path: str, bucket: str = "1 second") -> DataFrame:
    """Messages published, delivered and acknowledged per time bucket."""
    kinds = ["published", "routed", "delivered", "acked"]
    return (events(spark, path).filter(F.col("kind").isin(*kinds))
            .groupBy(F.window("time", bucket).getField("start").alias("bucket"))
            .pivot("kind", kinds).count().na.fill(0)
            .orderBy("bucket"))


def delays(spark, path: str) -> DataFrame:
    """Per delayed exchange (issue 21, store/core/delayed.py): messages held and released, the delays
    asked for, and how late each release came after its due time (ms; the ``delay_released``
    event's detail is that lateness in microseconds of leader-stamped time)."""
    ev = events(spark, path).filter(F.col("kind").isin("delayed", "delay_released"))
    held = F.col("kind") == "delayed"
    late = F.when(~held, F.col("detail").cast("long") / 1000.0)
    quantiles = F.percentile_approx(late, [0.5, 0.99], 10_000)
    return (ev.groupBy("vhost", "exchange")
            .agg(F.count(F.when(held, 1)).alias("delayed"), F.count(F.when(~held, 1)).alias("released"),
                 F.max(F.when(held, F.col("detail").cast("long"))).alias("max_delay_ms"),
                 quantiles.getItem(0).alias("late_p50_ms"), quantiles.getItem(1).alias("late_p99_ms"),
                 F.max(late).alias("late_max_ms"))
            .orderBy("vhost", "exchange"))


def deduplicated(spark, path: str) -> DataFrame:
    """Duplicates dropped (issue 21): by a deduplicating queue (``level`` queue: not enqueued there)
    or by an ``x-message-deduplication`` exchange (``level`` exchange: not routed at all)."""
    return (events(spark, path).filter(F.col("kind") == "deduplicated")
            .groupBy("vhost", F.col("detail").alias("level"), "exchange", "queue")
            .agg(F.count("*").alias("duplicates"), F.min("time").alias("first"), F.max("time").alias("last"))
            .orderBy(F.desc("duplicates"), "vhost", "exchange", "queue"))


# ---------------------------------------------------------------- one message's life, a queue at a time

#: Events of a message in one queue, in the order they happen to it there.
QUEUE_KINDS = ("routed", "delivered", "requeued", "acked", "rejected", "expired", "dead_lettered", "dropped",
               "purged", "deleted")
#: The published event of a copy names its original: ``dead-letter:<id>:<queue>`` (store/core/expiry.py)
#: or ``modified:<id>:<queue>`` (an AMQP 1.0 ``modified`` outcome, store/core/modify.py).
COPY_DETAIL = r"^(dead-letter|modified):(\d+):(.*)$"


def _micros(at) -> int:
    """A moment as integer microseconds since the epoch: a datetime (naive = UTC), an ISO-8601 text
    (``2026-11-28 10:42:00``, naive = UTC) or microseconds already."""
    if isinstance(at, int) and not isinstance(at, bool):
        return at
    if isinstance(at, str):
        at = dt.datetime.fromisoformat(at.strip())
    if isinstance(at, dt.datetime):
        if at.tzinfo is None:
            at = at.replace(tzinfo=dt.UTC)
        return (at - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    raise TypeError(f"not a moment: {at!r}")


def copies(spark, path, group: int = META_GROUP) -> dict[int, tuple[int, str, str]]:
    """Every copy in one group's history: copy id -> (original id, how: ``dead-letter``/``modified``,
    queue)."""
    parts = F.regexp_extract(F.col("detail"), COPY_DETAIL, 1)
    rows = (events(spark, path).filter((F.col("group") == group) & (F.col("kind") == "published")
                                       & F.col("detail").rlike(COPY_DETAIL))
            .select("message_id", parts.alias("how"),
                    F.regexp_extract(F.col("detail"), COPY_DETAIL, 2).cast("long").alias("original"),
                    F.regexp_extract(F.col("detail"), COPY_DETAIL, 3).alias("from_queue"))
            .collect())
    return {r["message_id"]: (r["original"], r["how"], r["from_queue"]) for r in rows}


def family(message_id: int, links: dict[int, tuple[int, str, str]]) -> dict[int, int]:
    """The message's originals and copies (dead-letter and modified hops, any depth, both ways):
    id -> generation (0 for the first original, +1 per hop)."""
    children: dict[int, list[int]] = {}
    for copy, (original, _how, _queue) in links.items():
        children.setdefault(original, []).append(copy)
    root, seen = message_id, {message_id}
    while root in links and links[root][0] not in seen:  # back to the first original
        root = links[root][0]
        seen.add(root)
    generations, todo = {root: 0}, [root]
    while todo:
        current = todo.pop()
        for child in children.get(current, ()):
            if child not in generations:
                generations[child] = generations[current] + 1
                todo.append(child)
    return generations


def message_ids(spark, path, amqp_message_id: str) -> list[int]:
    """The raftmq message ids of the messages published with this AMQP message-id property (of any
    group: see :func:`message_keys` for which)."""
    return sorted(message_id for _group, message_id in message_keys(spark, path, amqp_message_id))


def message_keys(spark, path, amqp_message_id: str) -> list[tuple[int, int]]:
    """(group, raftmq message id) of the messages published with this AMQP message-id property."""
    return sorted((r["group"], r["message_id"]) for r in load(spark, path, "messages")
                  .filter(F.col("amqp_message_id") == amqp_message_id).select("group", "message_id").collect())


def _who(kind, detail):
    """Who did an event, as far as the history says (its ``detail`` is kind-specific)."""
    copy = F.regexp_extract(detail, COPY_DETAIL, 1)
    return (F.when((kind == "published") & (copy != ""),
                   F.concat(copy, F.lit(" of message "), F.regexp_extract(detail, COPY_DETAIL, 2),
                            F.lit(" from queue "), F.regexp_extract(detail, COPY_DETAIL, 3)))
            .when(kind == "published", F.concat(F.lit("connection "), detail))
            .when((kind == "delivered") & (detail == ""), F.lit("basic.get"))
            .when((kind == "delivered") & (detail == NO_ACK), F.lit("basic.get (no-ack)"))
            .when((kind == "delivered") & detail.startswith(NO_ACK),
                  F.concat(F.lit("consumer "), F.substring(detail, len(NO_ACK) + 1, 1 << 20), F.lit(" (no-ack)")))
            .when(kind == "delivered", F.concat(F.lit("consumer "), detail))
            .when(kind == "dead_lettered", F.concat(F.lit("broker: "), detail))
            .when(kind.isin("expired", "delay_released", "purged", "deleted"), F.concat(F.lit("broker "), kind))
            .otherwise(detail))


def trace(spark, path, message_id: int, group: int = META_GROUP) -> DataFrame:
    """Every event of one message (``message_id`` of ``group``: ids are per group) and of its
    dead-letter and modified copies in that group (and of the originals it is a copy of), in the
    documented order (time, group, seq: with one group, sequence order), with who did each
    (``who``; every event column is kept, so what the history records of a principal comes along)
    and the copy's ``generation`` (0 for the first original, +1 per hop)."""
    ids = family(int(message_id), copies(spark, path, group))
    generation = F.create_map(*[F.lit(v).cast("long") for pair in ids.items() for v in pair])
    ev = events(spark, path).filter((F.col("group") == group) & F.col("message_id").isin(*ids))
    return (ev.withColumn("generation", generation[F.col("message_id")])
            .withColumn("who", _who(F.col("kind"), F.col("detail")))
            .orderBy(*ORDER))


def contents(spark, path, queue: str, at, vhost: str = "/") -> DataFrame:
    """The messages in ``queue`` at the moment ``at`` (a datetime, ISO text or microseconds; UTC),
    from the events up to and including it: ``ready``, ``unacked`` (with the ``consumer`` tag it
    was delivered to, empty for basic.get), or ``delayed`` (held by a delayed exchange then and
    routed to this queue on release -- or, not released by the end of the history, held by an
    exchange bound to the queue at that moment).  One row per message with its AMQP message-id,
    ``since`` (its last event in the queue), ``routed`` (when it entered) and ``deliveries`` so far.

    A message leaves the queue with acked, rejected, expired, dead_lettered, dropped, purged,
    deleted, a delivery that needs no acknowledgement (detail ``no-ack:<tag>``), or a
    ``modified:<id>:<queue>`` copy taking its place (the copy is then requeued)."""
    t = _micros(at)
    when = F.timestamp_micros(F.lit(t))
    # One load per scan: see "Self-joins" in datasource.py.
    own = (events(spark, path).filter((F.col("vhost") == vhost) & (F.col("queue") == queue)
                                      & F.col("kind").isin(*QUEUE_KINDS) & (F.col("time") <= when))
           .select("group", "seq", "time", "kind", "message_id", "exchange", "routing_key", "size", "detail"))
    replaced = (events(spark, path).filter((F.col("kind") == "published") & (F.col("vhost") == vhost)
                                           & (F.col("time") <= when)
                                           & F.col("detail").rlike(r"^modified:\d+:"))
                .filter(F.regexp_extract("detail", COPY_DETAIL, 3) == queue)
                .select("group", "seq", "time", F.lit("replaced").alias("kind"),
                        F.regexp_extract("detail", COPY_DETAIL, 2).cast("long").alias("message_id"),
                        "exchange", "routing_key", "size", "detail"))
    last = F.max_by(F.struct("kind", "detail", "time"), "seq")
    queued = (own.unionByName(replaced).groupBy("group", "message_id")
              .agg(last.alias("last"), F.min(F.when(F.col("kind") == "routed", F.col("time"))).alias("routed"),
                   F.count(F.when(F.col("kind") == "delivered", 1)).alias("deliveries"),
                   F.first("exchange").alias("exchange"), F.first("routing_key").alias("routing_key"),
                   F.first("size").alias("size"))
              .withColumn("state", F.when(F.col("last.kind").isin("routed", "requeued"), F.lit("ready"))
                          .when((F.col("last.kind") == "delivered") & ~F.col("last.detail").startswith(NO_ACK),
                                F.lit("unacked")))
              .filter(F.col("state").isNotNull())
              .select("group", "message_id", "state",
                      F.when(F.col("state") == "unacked", F.col("last.detail")).alias("consumer"),
                      F.col("last.time").alias("since"), "routed", "deliveries", "exchange", "routing_key", "size"))
    rows = queued.unionByName(_delayed_for(spark, path, queue, vhost, when))
    names = load(spark, path, "messages").select("group", "message_id", "amqp_message_id")
    return (rows.join(names, ["group", "message_id"], "left")
            .select(F.lit(vhost).alias("vhost"), F.lit(queue).alias("queue"), "group", "message_id", "amqp_message_id",
                    "state", "consumer", "since", "routed", "deliveries", "exchange", "routing_key", "size")
            .orderBy("routed", "since", "group", "message_id"))


def _delayed_for(spark, path, queue: str, vhost: str, when) -> DataFrame:
    """``contents``' delayed rows: messages a delayed exchange held at ``when`` that were routed to
    ``queue`` on release, or (not released by the end of the history) whose exchange was bound to
    it at ``when``."""
    held = (events(spark, path).filter((F.col("kind") == "delayed") & (F.col("vhost") == vhost)
                                       & (F.col("time") <= when))
            .select("group", "message_id", "exchange", "routing_key", "size", F.col("time").alias("since")))
    ended = (events(spark, path).filter(F.col("kind").isin("delay_released", "dropped") & (F.col("vhost") == vhost)
                                        & (F.col("queue") == ""))
             .select("group", "message_id", F.col("time").alias("ended")))
    routed_here = (events(spark, path).filter((F.col("kind") == "routed") & (F.col("vhost") == vhost)
                                              & (F.col("queue") == queue))
                   .select("group", "message_id").distinct().withColumn("routed_here", F.lit(True)))
    bound = (load(spark, path, "bindings")
             .filter((F.col("vhost") == vhost) & (F.col("destination") == queue)
                     & (F.col("destination_type") == "queue") & (F.col("bound") <= when)
                     & (F.col("unbound").isNull() | (F.col("unbound") > when)))
             .select(F.col("source").alias("exchange")).distinct().withColumn("bound_here", F.lit(True)))
    ends = ended.groupBy("group", "message_id").agg(F.min("ended").alias("ended"))
    return (held.join(ends, ["group", "message_id"], "left")
            .filter(F.col("ended").isNull() | (F.col("ended") > when))
            .join(routed_here, ["group", "message_id"], "left")
            .join(bound, "exchange", "left")
            .filter(F.col("routed_here") | (F.col("ended").isNull() & F.col("bound_here")))
            .select("group", "message_id", F.lit("delayed").alias("state"), F.lit(None).cast("string").alias("consumer"),
                    "since", F.lit(None).cast("timestamp").alias("routed"), F.lit(0).cast("long").alias("deliveries"),
                    "exchange", "routing_key", "size"))


JOBS = {"summary": summary, "unconsumed": unconsumed, "redelivered": redelivered,
        "dead-letters": dead_letters, "latency": latency, "throughput": throughput,
        "delays": delays, "deduplicated": deduplicated}
