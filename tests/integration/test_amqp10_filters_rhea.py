"""Source filters with rhea receivers (AMQP 1.0 3.5.3, issue 37): two receivers with complementary JMS
selectors on one queue each get exactly their messages, the attach replies echo the selector, a message
neither matches stays for an unfiltered receiver, and a selector that does not parse is refused with
``amqp:invalid-field``.  The scenario is in amqp10_rhea_filters.js; rhea is installed as for
test_amqp10_rhea.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pika

from tests.integration.helpers import pika_params, uniq
from tests.integration.test_amqp10_rhea import rhea_dir  # noqa: F401  (the fixture)

SCRIPT = Path(__file__).with_name("amqp10_rhea_filters.js")


def test_rhea_complementary_selectors(broker, rhea_dir: Path) -> None:  # noqa: F811
    import pytest

    if broker.kind != "raftmq":
        pytest.skip("RabbitMQ 3.10's 1.0 plugin is not enabled in the reference peer")
    conn = pika.BlockingConnection(pika_params(broker.url))
    queue = uniq("rhea-sel")
    conn.channel().queue_declare(queue)
    env = {**os.environ, "NODE_PATH": str(rhea_dir / "node_modules")}
    result = subprocess.run(["node", str(SCRIPT), str(broker.port), queue], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, (result.stdout, result.stderr[-2000:])
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["red"] == {"bodies": ["panda", "squirrel"], "echoed": ["jms-selector"]}
    assert seen["others"] == {"bodies": ["grasshopper", "whale"], "echoed": ["jms-selector"]}
    assert seen["bad"] == "amqp:invalid-field"
    assert seen["rest"]["bodies"] == ["stone"] and seen["rest"]["echoed"] == []
    conn.close()
