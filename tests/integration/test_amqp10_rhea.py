"""AMQP 1.0 with rhea (Node.js, from the npm registry): the client most JavaScript 1.0 users run.

rhea is installed at test time into a cache directory outside the repository (``RAFTMQ_NPM_CACHE``,
default ``~/.cache/raftmq-test-npm``; nothing under node_modules is committed); the test skips when
node/npm are missing or the registry cannot be reached.  The scenarios are in amqp10_rhea.js.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pika
import pytest

from tests.integration.helpers import pika_params, uniq, wait_until
from tests.support.npm import npm_package

RHEA_VERSION = "3"
SCRIPT = Path(__file__).with_name("amqp10_rhea.js")


@pytest.fixture(scope="session")
def rhea_dir() -> Path:
    return npm_package("rhea", RHEA_VERSION)


def test_rhea_scenarios(broker, rhea_dir: Path) -> None:
    """2.6.12 outcomes, 2.6.7 credit and drain, 2.6.14 multi-frame, 3.5.3 dynamic source, with rhea."""
    if broker.kind != "raftmq":
        pytest.skip("RabbitMQ 3.10's 1.0 plugin is not enabled in the reference peer")
    conn = pika.BlockingConnection(pika_params(broker.url))
    channel = conn.channel()
    queue, dlq, kept = uniq("rhea"), uniq("rhea-dlq"), uniq("rhea-kept")
    channel.queue_declare(dlq)
    channel.queue_declare(kept)
    channel.queue_declare(queue, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    env = {**os.environ, "NODE_PATH": str(rhea_dir / "node_modules")}
    result = subprocess.run(["node", str(SCRIPT), str(broker.port), queue, dlq, kept], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, (result.stdout, result.stderr[-2000:])
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["accepted"] == 6
    assert seen["with_credit_2"] == 2  # no more than the credit
    assert seen["after_drain"] == 6 and seen["credit_after_drain"] == 0
    assert seen["bodies"] == [f"m{i}" for i in range(6)]
    assert seen["delivery_counts"] == [0, 0, 1]  # released not counted, modified{delivery-failed} counted
    assert seen["big_length"] == 300000
    assert seen["reply_to_prefix"] == "/queues/" and seen["reply"] == ["pong", "c9"]
    wait_until(lambda: channel.queue_declare(dlq, passive=True).method.message_count == 1,
               what="the rejected message dead-lettered")
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    # 1.0 -> 1.0 keeps what 0-9-1 cannot carry (docs/message-mapping.md, format AMQP100)
    assert seen["typed"] == {"subject": "subj", "group_sequence": 7, "reply_to_group_id": "rg",
                             "absolute_expiry_time": 1_900_000_000_123, "annotation": "b", "u8": 200,
                             "ts": 1_600_000_000_321, "sym": "s", "plain": "v"}
    # rhea -> proton: the application-properties keep their 1.0 types (3.2.5)
    proton = pytest.importorskip("proton")
    from proton.utils import BlockingConnection

    amqp = BlockingConnection(f"amqp://guest:guest@{broker.host}:{broker.port}", timeout=10)
    try:
        receiver = amqp.create_receiver(f"/queues/{kept}", credit=1)
        got = receiver.receive(timeout=10)
        receiver.accept()
    finally:
        amqp.close()
    assert type(got.properties["u8"]) is proton.ubyte and type(got.properties["sym"]) is proton.symbol
    assert type(got.properties["ts"]) is proton.timestamp and got.properties["ts"] == 1_600_000_000_321
    assert got.expiry_time == 1_900_000_000.123 and got.group_sequence == 7
    conn.close()
