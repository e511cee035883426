"""One SparkSession for every Spark test (starting one costs 10-30 s: shared/notes/spark.md)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    from raftmq.spark.session import audit_session

    session = audit_session()
    yield session
    session.stop()
