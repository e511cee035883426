"""ops/metrics_server.py: the exposition a scraper negotiates, and the metrics port's own cap.

Checks: ``encode`` gives the text format 0.0.4 by default and OpenMetrics 1.0.0 when ``Accept`` asks
(prometheus_client's ``choose_encoder``), restricts to the ``name[]`` samples (which the old
prometheus_client server answered with nothing: a collector without ``describe()`` was left out of
restricted registries), and gzips on request; ``MetricsListener`` refuses beyond
``metrics_max_connections`` (not ``http_max_connections``) with 503, counted under its own stats and
logged naming the setting (real aiohttp server, real loopback sockets).
"""

from __future__ import annotations

import asyncio
import gzip
import logging

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from raftmq.node.config import Config
from raftmq.node.descriptors import DescriptorReserve
from raftmq.ops.metrics_server import MetricsListener, encode


def _families():
    gauge = GaugeMetricFamily("raftmq_connections", "client connections", labels=["node"])
    gauge.add_metric(["n1"], 3)
    counter = CounterMetricFamily("raftmq_messages_published", "messages published", labels=["node"])
    counter.add_metric(["n1"], 7)
    return [gauge, counter]


def test_text_format_by_default_and_openmetrics_when_asked():
    body, content_type = encode(_families(), "", [], False)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert b'raftmq_connections{node="n1"} 3.0' in body and b"raftmq_messages_published_total" in body
    assert b"# EOF" not in body
    body, content_type = encode(_families(), "application/openmetrics-text; version=1.0.0", [], False)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")


def test_name_filter_and_gzip():
    body, _ = encode(_families(), "", ["raftmq_messages_published_total"], True)
    text = gzip.decompress(body).decode()
    assert "raftmq_messages_published_total" in text and "raftmq_connections" not in text


def test_the_cap_is_metrics_max_connections(caplog):
    async def main():
        config = Config(metrics_max_connections=2, http_max_connections=100, http_header_timeout=30)

        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="hello")

        listener = MetricsListener(web.Server(hello), config, DescriptorReserve(0))
        listener.stats.open, listener.stats.refused = 0, {}
        tcp = await asyncio.get_running_loop().create_server(listener, "127.0.0.1", 0)
        port = tcp.sockets[0].getsockname()[1]
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(2):
            answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert listener.stats.name == "metrics" and listener.stats.open == 2
        assert listener.stats.refused == {"connections": 1}
        for _, w in held:
            w.close()
        writer.close()
        await asyncio.sleep(0.05)
        assert listener.stats.open == 0
        tcp.close()

    with caplog.at_level(logging.WARNING, logger="raftmq.ops.metrics_server"):
        asyncio.run(main())
    assert any("metrics_max_connections" in r.getMessage() for r in caplog.records)
