"""A SparkSession tuned for auditing on a small machine, with the ``raftmq`` format registered.

The settings come from measurements on a 2-core machine (shared/notes/spark.md): a local master,
no UI, two shuffle partitions, a JIT that starts fast, UTC session time, and Python filter
pushdown switched on (the ``raftmq`` reader relies on it for sequence and time ranges).  Spark's
Python workers must import raftmq: ``PYSPARK_PYTHON`` defaults to this interpreter.
"""

from __future__ import annotations

import json
import os
import sys

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # raftmq audit draws its own progress line
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def audit_session(master: str = "local[2]", app_name: str = "raftmq-audit", **conf: str):
    """Get (or create) a SparkSession for auditing and register the ``raftmq`` data source."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULTS, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register(spark) -> None:
    from .datasource import RaftmqDataSource

    spark.dataSource.register(RaftmqDataSource)


def load(spark, path, table: str = "events", **options):
    """``spark.read.format("raftmq")`` on a snapshot directory, or on several nodes' snapshots read
    as one table (a list of directories: ``option("paths")``, spark/union.py)."""
    reader = spark.read.format("raftmq").option("table", table)
    if isinstance(path, list | tuple):
        paths = [str(p) for p in path]
        reader = reader.option("path", paths[0]) if len(paths) == 1 else reader.option("paths", json.dumps(paths))
    else:
        reader = reader.option("path", str(path))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()
