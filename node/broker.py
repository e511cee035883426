"""The node's broker: the state machine, its log, and the connections the outputs go to.

Front ends never touch the state machine directly; they ``submit`` commands and receive outputs
through the ``Endpoint`` interface. Reads they make for early validation (``machine`` attribute) are
local and advisory: apply re-validates every command.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import time
from typing import Protocol

from raftmq.ops.config import Config
from raftmq.raft.local import LocalLog
from raftmq.store.commands import OUT_CANCEL, OUT_DELIVER, OUT_REPLY, Op
from raftmq.store.durable import DurableStore
from raftmq.store.machine import StateMachine

from .auth import Authenticator

log = logging.getLogger(__name__)

TICK_INTERVAL = 0.05  # seconds between expiry ticks while any queue has expiring messages
ALARM_CHECK_INTERVAL = 1.0


class Endpoint(Protocol):
    """What a front-end connection offers the broker."""

    def on_reply(self, token: int | None, result: tuple, channel: int | None) -> None: ...

    def on_deliver(self, channel: int, consumer_tag: str, delivery: tuple) -> None: ...

    def on_cancel(self, channel: int, consumer_tag: str) -> None: ...

    def flush(self) -> None: ...

    def set_blocked(self, reason: str | None) -> None: ...


class Broker:
    def __init__(self, config: Config) -> None:
        self.config = config
        data_dir = config.resolved_data_dir()
        self.store = DurableStore(os.path.join(data_dir, "state"))
        self.machine = StateMachine(self.store)
        self.log = LocalLog(self.machine, self._on_outputs)
        self.auth = Authenticator(config.users)
        self.endpoints: dict[str, Endpoint] = {}
        self._conn_ids = itertools.count(1)
        # Connection ids must never repeat across restarts once the log is replicated: prefix a
        # boot stamp (taken here, outside apply, so the state machine stays deterministic).
        self._boot = f"{config.node_id}.{time.time_ns() // 1000:x}"
        self.alarm: str | None = None
        self._tasks: list[asyncio.Task] = []
        self.known_hosts = f"{config.host}:{config.port}"

    async def start(self) -> None:
        for vhost in self.config.vhosts:
            if vhost not in self.machine.vhosts:
                self.submit([Op.VHOST_ADD, None, None, vhost])
        self._tasks.append(asyncio.create_task(self._tick_loop()))
        self._tasks.append(asyncio.create_task(self._alarm_loop()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self.store.sync()
        self.store.close()

    # ------------------------------------------------------------------ connections

    def register(self, endpoint: Endpoint) -> str:
        conn_id = f"{self._boot}.{next(self._conn_ids)}"
        self.endpoints[conn_id] = endpoint
        return conn_id

    def unregister(self, conn_id: str) -> None:
        if self.endpoints.pop(conn_id, None) is not None:
            self.submit([Op.CONNECTION_CLOSE, conn_id, None])

    @property
    def connection_count(self) -> int:
        return len(self.endpoints)

    def submit(self, command: list) -> None:
        self.log.submit(command)

    # ------------------------------------------------------------------ outputs

    def _on_outputs(self, outputs: list) -> None:
        endpoints = self.endpoints
        touched: dict[str, Endpoint] = {}
        for out in outputs:
            endpoint = endpoints.get(out[0])
            if endpoint is None:
                continue
            kind = out[1]
            if kind == OUT_DELIVER:
                endpoint.on_deliver(out[2], out[3], out[4])
            elif kind == OUT_REPLY:
                endpoint.on_reply(out[2], out[3], out[4])
            elif kind == OUT_CANCEL:
                endpoint.on_cancel(out[2], out[3])
            touched[out[0]] = endpoint
        for endpoint in touched.values():
            endpoint.flush()

    # ------------------------------------------------------------------ timers

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            if self.machine.next_expiry_due():
                self.submit([Op.TICK, None, None])

    async def _alarm_loop(self) -> None:
        while True:
            self.check_alarms()
            await asyncio.sleep(ALARM_CHECK_INTERVAL)

    def check_alarms(self) -> None:
        reason = None
        if self.machine.message_bytes > self.config.memory_high_watermark:
            reason = "low on memory"
        else:
            try:
                free = shutil.disk_usage(self.store.path).free
            except OSError:
                free = self.config.disk_free_limit + 1
            if free < self.config.disk_free_limit:
                reason = "low on disk"
        if reason != self.alarm:
            log.warning("resource alarm %s", f"set: {reason}" if reason else "cleared")
            self.alarm = reason
            for endpoint in list(self.endpoints.values()):
                endpoint.set_blocked(reason)
