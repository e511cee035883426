"""`raftmq cluster status|add|remove|rebalance`: membership through pysyncobj's admin protocol.

The commands talk to a member's Raft port (encrypted and authenticated with the cluster secret),
the way pysyncobj's ``syncobj_admin`` does. Adding a member: start the new node with a config that
lists every member including itself, then ``raftmq cluster add --raft HOST:PORT`` against any
existing member; the new node announces its client address through the log once it has joined.
Removing: ``raftmq cluster remove --raft HOST:PORT``; the leader then releases the removed node's
connections (unacked messages return to their queues) and drops it from known-hosts.
With Raft groups (issue 34), ``status`` shows every group's leader and replicas and ``rebalance``
spreads the groups' leaders over the live members (node/group_leaders.py).

With queue groups (issue 34, ``raft_groups`` > 1) every group is a Raft group of its own, on the
members' Raft ports moved by ``group x raft_group_port_step`` (Config.for_group): ``add`` and
``remove`` change the metadata group, then each queue group the same way, so that the new node's
workers take part in their groups (and a removed node's leave them).
"""

from __future__ import annotations

import json
import time

from pysyncobj.utility import UtilityException

from raftmq.node import group_leaders
from raftmq.node.group_leaders import survey
from raftmq.raft.wire import admin_utility

from .config import Config


def _target(config: Config, via: str | None) -> list[str]:
    return [via] if via else [m.raft for m in config.cluster]


def run_admin(config: Config, command: list[str], via: str | None = None, timeout: float = 10.0):
    """Send ``command`` to the first member that answers; return (address, result)."""
    errors = []
    for address in _target(config, via):
        try:
            result = admin_utility(config.secret(), timeout).executeCommand(address, command)
            return address, result
        except UtilityException as exc:
            errors.append(f"{address}: {exc}")
    raise SystemExit("no member answered: " + "; ".join(errors))


def status(config: Config, via: str | None = None) -> dict:
    """The asked member's pysyncobj status; with raft_groups > 1 also ``groups``: every group's
    leader, term and each member's replica (role, term, commit/applied index, lag)."""
    address, result = run_admin(config, ["status"], via)
    out = {str(k): (v.address if hasattr(v, "address") else v) for k, v in result.items()}
    out["asked"] = address
    if config.raft_groups > 1:
        out["groups"] = survey(config).rows()
    return out


def rebalance(config: Config, to_node: str | None = None, groups: list[int] | None = None,
              timeout: float = 15.0) -> dict:
    """``raftmq cluster rebalance``: spread the groups' leaders (or move them to ``to_node``) and
    return what moved, what did not in time, and each group's leader now."""
    if config.raft_groups < 2:
        raise SystemExit("rebalance: this cluster has one Raft group (raft_groups = 1): nothing to move")
    try:
        return group_leaders.rebalance(config, to_node, groups, timeout).as_dict()
    except ValueError as exc:
        raise SystemExit(f"rebalance: {exc}") from exc


def change(config: Config, action: str, raft_address: str, via: str | None = None,
           timeout: float = 10.0) -> str:
    """``action`` is "add" or "remove"; asks the leader (found through any member) to change it.

    A leader cannot remove itself (pysyncobj refuses): leadership is transferred first.
    """
    st = status(config, via)
    leader = st.get("leader") or st["asked"]
    if action == "remove" and leader == raft_address:
        run_admin(config, ["transfer"], leader)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.2)
            leader = status(config, via).get("leader")
            if leader and leader != raft_address:
                break
        else:
            raise SystemExit(f"leadership did not move away from {raft_address} within {timeout}s")
    _, result = run_admin(config, [action, raft_address], leader)
    result = result.decode() if isinstance(result, bytes) else str(result)
    if not result.startswith("SUCCESS"):
        raise SystemExit(f"{action} {raft_address} failed: {result}")
    if config.group == 0:
        for group in range(1, config.raft_groups):
            change(config.for_group(group), action, group_address(config, raft_address, group),
                   group_address(config, via, group) if via else None, timeout)
    return result


def group_address(config: Config, raft_address: str, group: int) -> str:
    """A member's Raft address in queue group ``group`` (Config.for_group's port step)."""
    host, port = raft_address.rsplit(":", 1)
    return f"{host}:{int(port) + group * config.raft_group_port_step}"


def print_json(data) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))
