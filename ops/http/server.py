"""The HTTP management service: an aiohttp application on the broker's own event loop.

Handlers read the state machine directly (it belongs to this loop, so no locking) and change it
through the log (ops/control.py).  Over TLS with ``http_tls_cert``/``http_tls_key``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from raftmq.node.descriptors import DescriptorReserve
from raftmq.node.server import ListeningService

from ..control import Control
from ..operator import Gatekeeper
from . import auditchain, groupleaders, login, ownpages, raftview, resources, system, users
from .common import CONTEXT, Context, authenticate
from .crosssite import cross_site, security_headers
from .listener import HttpListener
from .members import MemberViews
from .rates import Rates

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

log = logging.getLogger(__name__)


def build_app(broker: Broker, gatekeeper: Gatekeeper | None = None) -> tuple[web.Application, Rates]:
    rates = Rates(broker)
    # Cross-site and non-JSON changes are refused before the login is checked (ops/http/crosssite.py);
    # bodies are capped at http_max_body (ops/http/bodies.py).
    app = web.Application(middlewares=[cross_site, authenticate], client_max_size=broker.config.http_max_body)
    app.on_response_prepare.append(security_headers)
    app[CONTEXT] = Context(broker, Control(broker), gatekeeper or Gatekeeper(broker), rates, MemberViews(broker))
    app.router.add_get("/", _page)
    app.router.add_get("/index.html", _page)
    for name in STATIC_FILES:
        app.router.add_get(f"/static/{name}", _static)
    login.add_routes(app)
    resources.add_routes(app)
    system.add_routes(app)
    raftview.add_routes(app)
    ownpages.add_routes(app)
    auditchain.add_routes(app)  # issue 36
    groupleaders.add_routes(app)  # issue 34
    users.add_routes(app)
    _accept_trailing_slash(app.router)
    return app, rates


def _accept_trailing_slash(router: web.UrlDispatcher) -> None:
    """Serve every /api path with a trailing slash too, as RabbitMQ does (measured on 3.10.8: 200
    for /api/queues/, /api/queues/%2F/, /api/overview/, /api/queues/%2F/NAME/ ...).  Tools send such
    paths: Celery Flower asks ``urljoin(broker_api, "queues//")``, i.e. ``/api/queues/``, for the
    default vhost.  Each /api resource gets a twin ending in "/" with the same handlers; a resource
    with a custom regex (``{side:source|destination}``) is left alone, its formatter would lose it."""
    for resource in list(router.resources()):
        info = resource.get_info()
        path = info.get("path") or info.get("formatter")
        if not path or not path.startswith("/api/") or path.endswith("/"):
            continue
        if "pattern" in info and web.DynamicResource(path).get_info()["pattern"].pattern != info["pattern"].pattern:
            continue
        for route in resource:
            router.add_route(route.method, path + "/", route.handler)


STATIC = Path(__file__).with_name("static")
PAGE = STATIC / "index.html"
# The UI's files (issue 35): served to anyone, they hold no data; the data is behind the login.
STATIC_FILES = {"app.js": "text/javascript", "app.css": "text/css"}
PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


async def _page(request: web.Request) -> web.Response:
    """The management UI (ops/http/static/index.html and app.js): a login form, then the tabs,
    on this node's API.  Its script is a file of this origin: the CSP allows no inline script."""
    return web.Response(text=PAGE.read_text(), content_type="text/html", headers={"Content-Security-Policy": PAGE_CSP,
                                                                                  "Cache-Control": "no-cache"})


async def _static(request: web.Request) -> web.Response:
    name = request.path.rsplit("/", 1)[1]
    return web.Response(text=(STATIC / name).read_text(), content_type=STATIC_FILES[name],
                        headers={"Cache-Control": "no-cache"})


def _tls(broker: Broker) -> ssl.SSLContext | None:
    config = broker.config
    if not config.http_tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.http_tls_cert, config.http_tls_key)
    return context


def serve_http(broker: Broker) -> Callable[[], None]:
    """Start the API on host:http_port; returns its stop function (a service: node/server.py)."""
    loop = asyncio.get_running_loop()
    app, rates = build_app(broker)
    config = broker.config
    # aiohttp closes a connection without a complete request after keepalive_timeout (its default:
    # 3,630 s); the first request's headers are timed by HttpListener (ops/http/listener.py).
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=config.http_idle_timeout)
    servers: list[asyncio.Server] = []

    async def start() -> None:
        await runner.setup()
        listener = HttpListener(runner.server, config, DescriptorReserve(config.fd_reserve))
        tls = _tls(broker)
        handshake = {"ssl_handshake_timeout": config.http_header_timeout} if tls and config.http_header_timeout > 0 else {}
        servers.append(await loop.create_server(listener, config.host, config.http_port, ssl=tls,
                                                reuse_address=True, backlog=128, **handshake))
        log.info("HTTP management API on %s://%s:%d", "https" if config.http_tls_cert else "http",
                 config.host, config.http_port)

    started = loop.create_task(start())

    def check(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("HTTP management API not started on %s:%d: %s", config.host, config.http_port,
                      task.exception())

    started.add_done_callback(check)
    sampler = loop.create_task(rates.run())

    def stop() -> None:
        sampler.cancel()
        started.cancel()
        for server in servers:
            server.close()
        loop.create_task(runner.cleanup())

    return ListeningService(stop, started)
