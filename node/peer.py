"""The client address of a transport, as the front ends log it and the auth layer checks it."""

from __future__ import annotations

import asyncio


def peer_of(transport: asyncio.BaseTransport) -> tuple[str, str | None]:
    """("host:port" for logs, host for the loopback-only check); ("?", None) when unknown."""
    peer = transport.get_extra_info("peername")
    return (f"{peer[0]}:{peer[1]}", peer[0]) if peer else ("?", None)
