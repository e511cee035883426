"""The login pool (node/logins.py): work off the loop, a bound on pending logins, prompt refusals."""

from __future__ import annotations

import asyncio
import threading

import pytest

from raftmq.node.auth import Authenticator, AuthError, LoginBusy
from raftmq.node.config import UserConfig
from raftmq.node.logins import LoginPool


def test_pool_runs_off_the_loop_and_refuses_beyond_its_limit():
    """Work runs in a pool thread, not the loop's; with ``limit`` pending the next call is refused at
    once with the given exception (counted), and a slot is freed only when its thread is done,
    even if its waiter was cancelled."""
    release = threading.Event()

    async def main():
        pool = LoginPool(LoginBusy, workers=1, limit=2)
        loop_thread = threading.get_ident()
        assert await pool.run(threading.get_ident) != loop_thread
        waiters = [asyncio.ensure_future(pool.run(release.wait, 5)) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert pool.pending == 2
        with pytest.raises(LoginBusy):
            await pool.run(int)
        assert pool.refused == 1
        waiters[0].cancel()  # its thread still waits: the slot stays taken
        await asyncio.sleep(0.05)
        assert pool.pending == 2
        release.set()
        assert await waiters[1] is True
        for _ in range(100):
            if pool.pending == 0:
                break
            await asyncio.sleep(0.01)
        assert pool.pending == 0 and await pool.run(int) == 0
        pool.close()

    asyncio.run(main())


def test_login_is_awaitable_and_busy_is_an_auth_error():
    """``Authenticator.login`` gives the principal of a good login, AuthError for a bad one, and
    ``LoginBusy`` is an AuthError, so every front end answers it as a refused login."""
    async def main():
        auth = Authenticator({"u": UserConfig("p")}, login_workers=1, login_limit=4)
        assert (await auth.login("PLAIN", b"\x00u\x00p", "127.0.0.1")).name == "u"
        with pytest.raises(AuthError):
            await auth.login("PLAIN", b"\x00u\x00wrong", "127.0.0.1")
        auth.pool.close()

    asyncio.run(main())
    assert issubclass(LoginBusy, AuthError)
