"""Issue 36, who, through Spark: the scenario of tests/support/audit_who.py (pika and the HTTP API
against one real node) read with ``spark.read.format("raftmq")`` -- the new event kinds, the
``conn``/``user``/``protocol``/``address``/``connection_name`` columns (per-message events joined
to the ``connections`` table by the reader), and the ``connections`` table itself.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from raftmq.spark.session import load
from tests.support import audit_who


@pytest.fixture(scope="module")
def who(tmp_path_factory):
    return audit_who.run(tmp_path_factory.mktemp("who-spark"))


def rows(df) -> list[dict]:
    return [r.asDict() for r in df.collect()]


def test_refusals_and_admin_changes_have_user_and_address_columns(spark, who):
    """access_refused (declare, consume, a vhost), login_refused and admin_change, filtered by kind (pushed
    down), each with the user and address of who did it."""
    events = load(spark, who.snapshot, "events")
    found = rows(events.where(F.col("kind").isin("access_refused", "login_refused", "admin_change"))
                 .select("kind", "vhost", "queue", "detail", "user", "protocol", "address", "connection_name")
                 .orderBy("seq"))
    refused = [r for r in found if r["kind"] == "access_refused" and r["vhost"] == "/" and r["protocol"] != "http"]
    assert [(r["queue"], r["detail"]) for r in refused] == [("payroll-copy", "queue_declare needs configure"),
                                                            ("payroll", "consume needs read")]
    assert {(r["user"], r["protocol"], r["address"], r["connection_name"]) for r in refused} == {
        (audit_who.ALICE, "AMQP 0-9-1", who.alice_address, audit_who.CONNECTION_NAME)}
    (vhost,) = [r for r in found if r["kind"] == "access_refused" and r["vhost"] == audit_who.OTHER_VHOST]
    assert (vhost["detail"], vhost["user"]) == ("connection_open needs access", audit_who.ALICE)
    (login,) = [r for r in found if r["kind"] == "login_refused" and r["protocol"] != "management"]
    assert (login["user"], login["address"]) == (who.intruder_user, "127.0.0.1")
    (change,) = [r for r in found if r["kind"] == "admin_change" and "set_permissions" in r["detail"]]
    assert (change["user"], change["protocol"], change["address"]) == ("guest", "http", "127.0.0.1")


def test_message_events_get_their_publishers_and_consumers_principal(spark, who):
    """published/delivered/acked of alice-inbox carry alice's principal, filled from the
    connections table; the connections table reads as its own DataFrame."""
    events = load(spark, who.snapshot, "events")
    inbox = rows(events.where((F.col("queue") == "alice-inbox") | (F.col("kind") == "published"))
                 .where(F.col("kind").isin("published", "delivered", "acked"))
                 .select("kind", "queue", "user", "protocol", "address", "connection_name"))
    alice = [r for r in inbox if r["user"] == audit_who.ALICE]
    assert sorted(r["kind"] for r in alice) == ["acked", "delivered", "published"]
    assert {r["address"] for r in alice} == {who.alice_address}
    connections = rows(load(spark, who.snapshot, "connections").where(F.col("user") == audit_who.ALICE))
    assert len(connections) == 1
    c = connections[0]
    assert (c["protocol"], c["address"], c["connection_name"]) == ("AMQP 0-9-1", who.alice_address,
                                                                  audit_who.CONNECTION_NAME)
    assert c["opened"] <= c["closed"]
