"""The Prometheus port (``metrics_port``): /metrics on the node's event loop, behind the bounded listener.

Until issue 31 the port was prometheus_client's ``start_http_server``, a threaded WSGI server: each
accepted socket got a thread that waited for its request without a timeout, so 300 half-open
sockets meant 300 threads and 300 descriptors held for as long as the peer liked, with no cap.
Now it is an aiohttp server behind the management API's listener wrapper (ops/http/listener.py):

* at most ``metrics_max_connections`` connections (a few Prometheus servers scrape a node; beyond
  that: 503, closed), and none while fewer than ``fd_reserve`` descriptors remain (kept for AMQP
  logins, node/descriptors.py);
* the first request's headers within ``http_header_timeout``, later ones within
  ``http_idle_timeout`` (the same settings as the management API: a scraper is an HTTP client);
* refusals and timeouts counted under ``listener="metrics"`` (``raftmq_listener_*``) and logged at
  most once per 10 s per kind.

Like RabbitMQ's prometheus plugin (15692) the endpoint needs no credentials, so it answers nothing
but ``GET``/``HEAD /metrics`` (404 elsewhere, 405 for other methods) and names no software version
(``Server: raftmq``).  What scrapers relied on is kept: the content type negotiated from ``Accept``
(text format 0.0.4 by default, OpenMetrics when asked), gzip when ``Accept-Encoding`` allows it, and
``name[]`` to restrict the samples (which the old server answered with nothing), all through
prometheus_client's own ``choose_encoder``.

Cost: the broker's state belongs to the event loop, so the collector (ops/metrics.py) runs there --
it only copies numbers into metric families, and lets the loop run every 1,000 queues (the old
threaded server read the same dicts from another thread, racing the loop: 500s).  Turning the
families into text (and gzip) is the larger part and runs in one dedicated thread; one scrape is
built at a time, others wait their turn (bench/metrics_scrape.py measures both).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric

from raftmq.node.config import Config
from raftmq.node.descriptors import DescriptorReserve, listener_stats
from raftmq.node.group_figures import node_totals
from raftmq.node.server import ListeningService
from raftmq.node.status import bodies_status
from raftmq.store.core import queries as Q

from .http.listener import HttpListener
from .metrics import PAUSE, BrokerCollector

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

log = logging.getLogger(__name__)

SERVER = "raftmq"


class MetricsListener(HttpListener):
    """The management API's bounded listener with the metrics port's cap, stats and log lines."""

    what = "metrics"
    cap_setting = "metrics_max_connections"

    def __init__(self, server: Callable[[], asyncio.Protocol], config: Config,
                 reserve: DescriptorReserve | None = None) -> None:
        super().__init__(server, config, reserve, listener_stats("metrics"))
        self.refusals.logger = log


class _Collected:
    """Families already collected on the loop, as a collector the encoders can read in a thread."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self.families)


def encode(families: Sequence[Metric], accept: str, names: Sequence[str], compress: bool) -> tuple[bytes, str]:
    """The exposition of ``families`` as the ``Accept`` header asks (prometheus_client's choice), only
    the ``names`` given if any, gzipped if ``compress``; returns (body, content type)."""
    encoder, content_type = choose_encoder(accept)
    # Without support_collectors_without_names a collector without describe() is left out of a
    # restricted registry: prometheus_client's own server answered every name[] query with nothing.
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(_Collected(families))
    body = encoder(registry.restricted_registry(names) if names else registry)
    return (gzip.compress(body) if compress else body), content_type


class MetricsApp:
    """The /metrics handler: collect on the loop, encode in the one metrics thread, one at a time."""

    def __init__(self, broker: Broker) -> None:
        self.collector = BrokerCollector(broker)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics")
        self.turn = asyncio.Lock()

    async def metrics(self, request: web.Request) -> web.Response:
        names = request.query.getall("name[]", [])
        compress = gzip_accepted(request.headers.get("Accept-Encoding", ""))
        async with self.turn:
            families = []
            host = self.collector.broker.group_host  # issue 34: queue groups' queues from their workers
            figures = await host.figures.ask(None) if host is not None else None
            totals = None
            if host is not None:
                broker = self.collector.broker
                totals = await node_totals(broker, Q.message_stats(broker.machine), bodies_status(broker))
            for family in self.collector.collect_in_steps(figures, totals):
                if family is PAUSE:
                    await asyncio.sleep(0)  # let the loop run between chunks of queues
                else:
                    families.append(family)
            body, content_type = await asyncio.get_running_loop().run_in_executor(
                self.pool, encode, families, request.headers.get("Accept", ""), names, compress)
        headers = {"Content-Type": content_type}
        if compress:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    def application(self) -> web.Application:
        app = web.Application(client_max_size=4096)  # a scrape has no body
        app.router.add_get("/metrics", self.metrics)  # and HEAD
        app.on_response_prepare.append(_headers)
        return app


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: no software version, nothing a browser should frame or sniff."""
    response.headers["Server"] = SERVER
    response.headers.setdefault("X-Content-Type-Options", "nosniff")


def serve_metrics(broker: Broker) -> Callable[[], None]:
    """Start /metrics on host:metrics_port; returns its stop function (a service: ops/services.py)."""
    loop = asyncio.get_running_loop()
    config = broker.config
    handler = MetricsApp(broker)
    runner = web.AppRunner(handler.application(), access_log=None, keepalive_timeout=config.http_idle_timeout)
    servers: list[asyncio.Server] = []

    async def start() -> None:
        await runner.setup()
        listener = MetricsListener(runner.server, config, DescriptorReserve(config.fd_reserve))
        servers.append(await loop.create_server(listener, config.host, config.metrics_port,
                                                reuse_address=True, backlog=128))
        log.info("metrics on http://%s:%d/metrics", config.host, config.metrics_port)

    started = loop.create_task(start())

    def check(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("metrics not served on %s:%d: %s", config.host, config.metrics_port, task.exception())

    started.add_done_callback(check)

    def stop() -> None:
        started.cancel()
        for server in servers:
            server.close()
        loop.create_task(runner.cleanup())
        handler.pool.shutdown(wait=False)

    return ListeningService(stop, started)
