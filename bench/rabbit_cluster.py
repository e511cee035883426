"""A three-node RabbitMQ cluster on loopback, the fair peer of a three-node raftmq (quorum queues).

As /work/shared/notes/machine.md describes: three ``rabbitmq-server`` processes (r1..r3@localhost)
with their own ports, Mnesia and log directories, one private ``epmd`` (started here, ended by PID)
and one Erlang cookie in each node's private HOME; r2 and r3 then ``join_cluster`` r1.  Everything
binds 127.0.0.1.  The launcher (tests/support/rabbitmq.py) runs the binaries as the current user.

Usage::

    with RabbitCluster(3) as rc:
        rc.url(1)      # amqp URL of node r2
        rc.pids(0)     # the processes of node r1 (for RSS)
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.ops.local.node import free_port, probe_amqp  # noqa: E402
from tests.support.rabbitmq import (  # noqa: E402
    CONFIG_TEMPLATE,
    CTL_CANDIDATES,
    SERVER_CANDIDATES,
    _first_existing,
    _kill_group,
    _wait_port,
    available,
)


class RabbitCluster:
    def __init__(self, size: int = 3, start_timeout: float = 90.0, plugins: tuple[str, ...] = ()) -> None:
        """``plugins``: enabled offline on every node before boot, e.g. ("rabbitmq_amqp1_0",)."""
        self.size = size
        self.plugins = tuple(plugins)
        self.start_timeout = start_timeout
        self.base = Path(tempfile.mkdtemp(prefix="rabbit-cluster-"))
        self.cookie = secrets.token_hex(16).upper()
        self.epmd_port = free_port()
        self.ports = [free_port() for _ in range(size)]
        self.dist_ports = [free_port() for _ in range(size)]
        self.servers: list[subprocess.Popen | None] = [None] * size
        self._epmd: subprocess.Popen | None = None
        self.server_bin = _first_existing(SERVER_CANDIDATES, "rabbitmq-server")
        self.ctl_bin = _first_existing(CTL_CANDIDATES, "rabbitmqctl")

    def nodename(self, i: int) -> str:
        return f"r{i + 1}@localhost"

    def url(self, i: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.ports[i]}/%2F"

    def _dir(self, i: int) -> Path:
        return self.base / f"r{i + 1}"

    def _env(self, i: int) -> dict[str, str]:
        d = self._dir(i)
        env = dict(os.environ)
        env.update(
            HOME=str(d / "home"), RABBITMQ_NODE_PORT=str(self.ports[i]), RABBITMQ_NODENAME=self.nodename(i),
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_DIST_PORT=str(self.dist_ports[i]),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"), RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"), RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"), RABBITMQ_PID_FILE=str(d / "rabbitmq.pid"),
            RABBITMQ_USE_LONGNAME="false", ERL_EPMD_ADDRESS="127.0.0.1", ERL_EPMD_PORT=str(self.epmd_port),
        )
        env.pop("RABBITMQ_SERVER_START_ARGS", None)
        return env

    def ctl(self, i: int, *args: str, timeout: float = 60.0) -> str:
        r = subprocess.run([self.ctl_bin, "-n", self.nodename(i), *args], env=self._env(i), capture_output=True,
                           text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {self.nodename(i)} {' '.join(args)}: {r.stderr or r.stdout}")
        return r.stdout

    def start(self) -> RabbitCluster:
        if not available():
            raise RuntimeError("rabbitmq-server is not installed (apt-get install -y rabbitmq-server)")
        try:
            env = self._env(0)
            self._epmd = subprocess.Popen(
                [shutil.which("epmd") or "epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
            _wait_port("127.0.0.1", self.epmd_port, 10.0)
            for i in range(self.size):
                d = self._dir(i)
                for sub in ("home", "mnesia", "log"):
                    (d / sub).mkdir(parents=True, exist_ok=True)
                cookie = d / "home" / ".erlang.cookie"
                cookie.write_text(self.cookie)
                cookie.chmod(0o400)
                (d / "rabbitmq.conf").write_text(CONFIG_TEMPLATE.format(port=self.ports[i]))
                (d / "advanced.config").write_text("[].\n")
                (d / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
                (d / "rabbitmq-env.conf").write_text("")
                self._start_node(i)
            for i in range(self.size):
                self.wait_ready(i)
            for i in range(1, self.size):
                self.ctl(i, "stop_app")
                self.ctl(i, "join_cluster", self.nodename(0))
                self.ctl(i, "start_app")
                self.wait_ready(i)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, i: int) -> None:
        d = self._dir(i)
        with open(d / "server.out", "ab") as out:
            self.servers[i] = subprocess.Popen([self.server_bin], stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=self._env(i), cwd=str(d),
                                               start_new_session=True)

    def wait_ready(self, i: int, timeout: float | None = None) -> float:
        """Wait until node ``i`` has booted and answers AMQP; returns the seconds waited."""
        started = time.monotonic()
        deadline = started + (timeout or self.start_timeout)
        while time.monotonic() < deadline:
            srv = self.servers[i]
            if srv is None or srv.poll() is not None:
                raise RuntimeError(f"{self.nodename(i)} exited; see {self._dir(i)}/log")
            try:
                self.ctl(i, "await_startup", "--timeout", "5", timeout=15)
                if probe_amqp("127.0.0.1", self.ports[i], timeout=2.0):
                    return time.monotonic() - started
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.nodename(i)} not ready within {timeout or self.start_timeout}s")

    def kill9(self, i: int) -> None:
        srv = self.servers[i]
        if srv is not None:
            _kill_group_now(srv.pid)
            srv.wait(timeout=10)
            self.servers[i] = None

    def restart(self, i: int, hard: bool = True) -> float:
        """Kill (-9) node ``i``'s processes and boot it again; seconds from start to ready."""
        self.kill9(i)
        started = time.monotonic()
        self._start_node(i)
        self.wait_ready(i)
        return time.monotonic() - started

    def pids(self, i: int) -> list[int]:
        srv = self.servers[i]
        if srv is None:
            return []
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == srv.pid:  # same process group
                    out.append(int(entry))
        return out

    def stop(self) -> None:
        for i, srv in enumerate(self.servers):
            if srv is not None and srv.poll() is None:
                try:
                    self.ctl(i, "stop", timeout=30)
                except (RuntimeError, subprocess.TimeoutExpired, OSError):
                    pass
            if srv is not None:
                _kill_group(srv.pid)
                try:
                    srv.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            self.servers[i] = None
        if self._epmd is not None and self._epmd.poll() is None:
            self._epmd.terminate()
            try:
                self._epmd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._epmd.kill()
        self._epmd = None
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> RabbitCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group_now(pgid: int) -> None:
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
