"""Audit jobs over a history snapshot: importable functions returning DataFrames.

Every job takes a SparkSession with the ``raftmq`` format registered (``session.audit_session``)
and a snapshot directory (``raftmq snapshot``).  A message's life in one queue is the events
sharing its ``(vhost, queue, message_id)``: ``routed`` -> ``delivered`` (maybe several times,
with ``requeued`` between) -> ``acked`` | ``rejected`` | ``expired`` | ``purged`` | ``deleted``
| ``dropped``, and ``dead_lettered`` links it to a new message whose ``published`` event's
detail is ``dead-letter:<original id>:<queue>``.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .session import load

QUEUE_KEY = ["vhost", "queue", "message_id"]
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
            .orderBy("vhost", "queue", "message_id"))


def redelivered(spark, path: str) -> DataFrame:
    """Messages delivered more than once from the same queue."""
    return (events(spark, path).filter(F.col("kind") == "delivered")
            .groupBy(*QUEUE_KEY)
            .agg(F.count("*").alias("deliveries"), F.min("time").alias("first"), F.max("time").alias("last"))
            .filter(F.col("deliveries") > 1)
            .orderBy(F.desc("deliveries"), "vhost", "queue", "message_id"))


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


JOBS = {"summary": summary, "unconsumed": unconsumed, "redelivered": redelivered,
        "dead-letters": dead_letters, "latency": latency, "throughput": throughput,
        "delays": delays, "deduplicated": deduplicated}
