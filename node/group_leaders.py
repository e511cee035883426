"""Every Raft group's leader across the cluster, and moving them (issue 34): ``raftmq cluster
status`` and ``rebalance``, POST /api/raftmq/rebalance and the node's own rebalancing after a
node returns (node/rebalancer.py) all go through here.

Group ``g`` of member ``m`` listens on ``m``'s Raft port plus ``g x raft_group_port_step``
(``Config.for_group``); group 0 is the main process's.  Each of those ports answers pysyncobj's
admin protocol (sealed with the cluster secret, raft/wire.py), so one mechanism reaches every
group of every node, wherever its process is: ``status`` says whom a replica follows, and
``transfer ADDRESS`` asks a leader to hand over (Raft TimeoutNow, pysyncobj's
``transferLeadership``, the way ``raftmq cluster remove`` moves a leader off the node it removes).
Why this and not a frame on the main process's link to its workers: a group's leader is usually
on *another* node, which no link reaches; the admin request is handled on the replica's own tick
thread (no locking against pysyncobj's state from outside it); and it needs no change to the link,
so a cluster of one group is untouched.

pysyncobj refuses a transfer to a follower that has not matched the leader's last index (it would
lose the election), so under load ``transfer`` repeats the request every few milliseconds until
one lands while the target is level, and until the group's leader is the one asked for or the
time is up.  Every call blocks (a TCP exchange each): the node calls these in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pysyncobj.utility import UtilityException

from raftmq.raft.wire import admin_utility

from .config import Config
from .leader_spread import plan

LEADER_STATE = 2  # pysyncobj's _RAFT_STATE.LEADER in getStatus()["state"]
ROLES = {0: "follower", 1: "candidate", 2: "leader"}
RETRY = 0.02  # seconds between transfer requests the leader refused (the target lagging)
ELECTION = 0.3  # seconds for an accepted transfer's election before looking at the leader again
LOOK_AGAIN = 2.0  # seconds of refused requests before asking again who leads


def group_address(raft: str, group: int, step: int) -> str:
    """Member Raft address ``raft``'s port for group ``group``."""
    host, port = raft.rsplit(":", 1)
    return f"{host}:{int(port) + group * step}"


@dataclass
class GroupReplica:
    """One member's replica of one group, as it answered ``status`` (None fields: no answer)."""

    node: str
    address: str
    role: str | None = None
    term: int | None = None
    commit_index: int | None = None
    applied_index: int | None = None
    leader: str | None = None  # node id this replica follows (or leads)
    error: str | None = None


@dataclass
class Survey:
    """Every group's replicas on every configured member, asked at one moment."""

    groups: int
    members: list[str]
    replicas: dict[int, list[GroupReplica]] = field(default_factory=dict)

    @property
    def alive(self) -> set[str]:
        """Members whose metadata group (the main process) answered."""
        return {r.node for r in self.replicas.get(0, []) if r.error is None}

    def leader(self, group: int) -> str | None:
        """The node leading ``group``: a replica that says it leads (the highest term wins), else None."""
        leading = [r for r in self.replicas.get(group, []) if r.role == "leader"]
        return max(leading, key=lambda r: r.term or 0).node if leading else None

    def leaders(self) -> dict[int, str | None]:
        return {g: self.leader(g) for g in range(self.groups)}

    def rows(self) -> list[dict]:
        """One row per group: its leader, term, and each replica's commit/applied index and lag
        (entries behind the highest commit index any replica of the group reported)."""
        out = []
        for group in range(self.groups):
            replicas = self.replicas.get(group, [])
            top = max((r.commit_index or 0 for r in replicas), default=0)
            leader = self.leader(group)
            term = max((r.term or 0 for r in replicas if r.node == leader), default=None)
            out.append({"group": group, "leader": leader, "term": term, "replicas": [
                {"node": r.node, "role": r.role, "term": r.term, "commit_index": r.commit_index,
                 "applied_index": r.applied_index,
                 "lag": None if r.applied_index is None else max(0, top - r.applied_index),
                 **({"error": r.error} if r.error else {})} for r in replicas]})
        return out


def _ask(secret: str, address: str, command: list[str], timeout: float):
    return admin_utility(secret, timeout).executeCommand(address, command)


def survey(config: Config, timeout: float = 2.0) -> Survey:
    """Ask every group's port on every configured member for its status, in parallel."""
    members = [m.node_id for m in config.cluster]
    step = config.raft_group_port_step
    secret = config.secret()
    by_address = {group_address(m.raft, g, step): (m.node_id, g)
                  for m in config.cluster for g in range(config.raft_groups)}
    result = Survey(config.raft_groups, members)

    def one(address: str) -> GroupReplica:
        node, group = by_address[address]
        replica = GroupReplica(node, address)
        try:
            st = _ask(secret, address, ["status"], timeout)
        except (UtilityException, OSError) as exc:
            replica.error = str(exc) or "no answer"
            return replica
        if not isinstance(st, dict):
            replica.error = f"unexpected answer {st!r}"
            return replica
        replica.role = ROLES.get(st.get("state"), str(st.get("state")))
        replica.term = st.get("raft_term")
        replica.commit_index = st.get("commit_idx")
        replica.applied_index = st.get("last_applied")
        leader = st.get("leader")
        leader_address = getattr(leader, "address", leader)
        if leader_address is not None:
            replica.leader = by_address.get(str(leader_address), (str(leader_address), group))[0]
        return replica

    with ThreadPoolExecutor(max_workers=min(16, len(by_address))) as pool:
        for replica in pool.map(one, list(by_address)):
            result.replicas.setdefault(by_address[replica.address][1], []).append(replica)
    return result


def transfer(config: Config, group: int, to_node: str, timeout: float = 10.0) -> bool:
    """Make ``to_node`` lead ``group``: ask the group's leader to transfer until it has; True once done.

    pysyncobj refuses (FAIL) while the target's match index is short of the leader's last index,
    which under a steady stream of proposals is most of the time: the request is repeated every
    RETRY seconds until it lands in a moment the target has everything, then given ELECTION seconds
    to take effect before the leader is looked up again (an election may also pick someone else)."""
    step = config.raft_group_port_step
    target = group_address(config.member(to_node).raft, group, step)
    secret = config.secret()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = survey_group(config, group)
        if now == to_node:
            return True
        if now is None:
            time.sleep(0.1)  # electing
            continue
        leader = group_address(config.member(now).raft, group, step)
        look_again = min(deadline, time.monotonic() + LOOK_AGAIN)
        while time.monotonic() < look_again:
            try:
                answer = _ask(secret, leader, ["transfer", target], 2.0)
            except (UtilityException, OSError):
                break
            if str(answer).startswith("SUCCESS"):
                time.sleep(ELECTION)
                break
            time.sleep(RETRY)
    return survey_group(config, group) == to_node


def survey_group(config: Config, group: int, timeout: float = 1.0) -> str | None:
    """``group``'s leader now, by asking its replicas one after another until one names itself leader
    (or a leader another replica follows): cheaper than a whole survey while waiting."""
    step = config.raft_group_port_step
    secret = config.secret()
    followed: str | None = None
    for member in config.cluster:
        try:
            st = _ask(secret, group_address(member.raft, group, step), ["status"], timeout)
        except (UtilityException, OSError):
            continue
        if not isinstance(st, dict):
            continue
        if st.get("state") == LEADER_STATE:
            return member.node_id
        leader = getattr(st.get("leader"), "address", st.get("leader"))
        if leader is not None and followed is None:
            followed = next((m.node_id for m in config.cluster
                             if group_address(m.raft, group, step) == str(leader)), None)
    return followed


@dataclass
class Rebalanced:
    """What ``rebalance`` did: the moves asked (group -> node), those that did not happen in time,
    and each group's leader afterwards."""

    moves: dict[int, str]
    failed: list[int]
    leaders: dict[int, str | None]

    def as_dict(self) -> dict:
        return {"moves": {str(g): n for g, n in sorted(self.moves.items())}, "failed": self.failed,
                "leaders": {str(g): n for g, n in sorted(self.leaders.items())}}


def rebalance(config: Config, to_node: str | None = None, groups: Iterable[int] | None = None,
              timeout: float = 15.0) -> Rebalanced:
    """Spread the groups' leaders over the live members (leader_spread.plan), or, with ``to_node``,
    move ``groups`` (default: every group) to that node; wait for each move (``timeout`` in all)."""
    seen = survey(config)
    leaders = seen.leaders()
    if to_node is not None:
        config.member(to_node)  # ValueError for a node that is not a member
        wanted = range(config.raft_groups) if groups is None else groups
        moves = {g: to_node for g in wanted if leaders.get(g) != to_node}
    else:
        moves = plan(config.raft_groups, seen.members, seen.alive, leaders)
    deadline = time.monotonic() + timeout
    failed = []
    for group, node in sorted(moves.items()):
        if not transfer(config, group, node, max(1.0, deadline - time.monotonic())):
            failed.append(group)
    return Rebalanced(moves, failed, survey(config).leaders() if moves else leaders)
