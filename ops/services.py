"""What runs beside a broker node, chosen by configuration: the gRPC admin API, RabbitMQ's HTTP
management API and Prometheus metrics; and, always, the answers to other members' management views.

The composition root (``raftmq server``: ops/cli.py) hands these to ``node.server.run``; the broker
itself knows nothing of them.  Each starts once the broker runs and returns its stop function.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from .config import Config

if TYPE_CHECKING:
    from raftmq.node.broker import Broker
    from raftmq.node.server import Service


def services_for(config: Config) -> list[Service]:
    services: list[Service] = []
    if config.admin_port:
        services.append(_admin)
    if config.http_port:
        services.append(_http)
    if config.metrics_port:
        services.append(_metrics)
    # Every member answers the others' management views (its connections, Raft numbers, digest:
    # ops/http/members.py), with or without an HTTP API of its own: otherwise its clients would be
    # missing from the other members' pages (and pysyncobj would take the unknown request for a
    # node's greeting).
    services.append(_member_views)
    return services


def _member_views(broker: Broker) -> Callable[[], None]:
    from .http.members import MemberViews

    MemberViews(broker).start(asyncio.get_running_loop())
    return lambda: None


def _http(broker: Broker) -> Callable[[], None]:
    from .http.server import serve_http

    return serve_http(broker)


def _admin(broker: Broker) -> Callable[[], None]:
    from .admin import serve_admin

    server = serve_admin(broker, asyncio.get_running_loop(), broker.config.host, broker.config.admin_port)

    def stop() -> None:
        server.health_task.cancel()
        server.stop(grace=1)

    return stop


def _metrics(broker: Broker) -> Callable[[], None]:
    from .metrics_server import serve_metrics

    return serve_metrics(broker)
