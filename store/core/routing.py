"""Exchange-type matching: which bindings of one exchange a message matches.

Each exchange keeps a matcher rebuilt from its binding list whenever a binding changes (binds are
rare, routing is hot). Matchers return bindings in binding order, so routing is deterministic on
every node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Binding:
    source: str
    dest_is_queue: bool
    destination: str
    routing_key: str
    arguments: dict

    def same_as(self, other: Binding) -> bool:
        return (
            self.source == other.source
            and self.dest_is_queue == other.dest_is_queue
            and self.destination == other.destination
            and self.routing_key == other.routing_key
            and self.arguments == other.arguments
        )


HeadersFn = Callable[[], dict]


class DirectMatcher:
    __slots__ = ("_by_key",)

    def __init__(self, bindings: list[Binding]) -> None:
        self._by_key: dict[str, list[Binding]] = {}
        for b in bindings:
            self._by_key.setdefault(b.routing_key, []).append(b)

    def match(self, routing_key: str, headers: HeadersFn) -> list[Binding]:
        return self._by_key.get(routing_key, [])


class FanoutMatcher:
    __slots__ = ("_all",)

    def __init__(self, bindings: list[Binding]) -> None:
        self._all = list(bindings)

    def match(self, routing_key: str, headers: HeadersFn) -> list[Binding]:
        return self._all


class FailoverMatcher:
    """amq.failover (AMQP 0-10, 11.1.2.3): clients never route through it; the broker writes failover
    updates straight into the queues bound to it."""

    __slots__ = ()

    def __init__(self, bindings: list[Binding]) -> None:
        pass

    def match(self, routing_key: str, headers: HeadersFn) -> list[Binding]:
        return []


@dataclass(slots=True)
class _TrieNode:
    children: dict[str, _TrieNode] = field(default_factory=dict)
    bindings: list[tuple[int, Binding]] = field(default_factory=list)


class TopicMatcher:
    """A word trie; ``*`` matches exactly one word, ``#`` zero or more (0-9-1 reference 1.6.x topic)."""

    __slots__ = ("_root",)

    def __init__(self, bindings: list[Binding]) -> None:
        self._root = _TrieNode()
        for order, b in enumerate(bindings):
            node = self._root
            for word in b.routing_key.split("."):
                node = node.children.setdefault(word, _TrieNode())
            node.bindings.append((order, b))

    def match(self, routing_key: str, headers: HeadersFn) -> list[Binding]:
        words = routing_key.split(".")
        found: dict[int, Binding] = {}
        self._walk(self._root, words, 0, found)
        return [found[k] for k in sorted(found)]

    def _walk(self, node: _TrieNode, words: list[str], i: int, found: dict[int, Binding]) -> None:
        if i == len(words):
            for order, b in node.bindings:
                found[order] = b
            hash_node = node.children.get("#")
            if hash_node is not None:
                self._walk(hash_node, words, i, found)
            return
        word = words[i]
        child = node.children.get(word)
        if child is not None:
            self._walk(child, words, i + 1, found)
        if word != "*":
            star = node.children.get("*")
            if star is not None:
                self._walk(star, words, i + 1, found)
        hash_node = node.children.get("#")
        if hash_node is not None:
            # '#' swallows zero words (stay at i) or one more word (advance, staying on '#').
            for j in range(i, len(words) + 1):
                self._walk(hash_node, words, j, found)


class HeadersMatcher:
    """x-match all/any (and RabbitMQ's all-with-x / any-with-x) over the message's headers table."""

    __slots__ = ("_bindings",)

    def __init__(self, bindings: list[Binding]) -> None:
        self._bindings = list(bindings)

    def match(self, routing_key: str, headers: HeadersFn) -> list[Binding]:
        if not self._bindings:
            return []
        message_headers = headers()
        return [b for b in self._bindings if headers_match(b.arguments, message_headers)]


def headers_match(binding_args: dict, message_headers: dict) -> bool:
    mode = binding_args.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode("utf-8", "replace")
    include_x = mode.endswith("-with-x")
    want_all = not mode.startswith("any")
    for key, expected in binding_args.items():
        if key == "x-match" or (key.startswith("x-") and not include_x):
            continue
        present = key in message_headers
        # A binding value of void (None) matches on the key's presence alone.
        hit = present and (expected is None or message_headers[key] == expected)
        if want_all and not hit:
            return False
        if not want_all and hit:
            return True
    # Reached only when no key decided early: 'all' matched every key, 'any' matched none.
    return want_all


MATCHERS = {
    "direct": DirectMatcher,
    "fanout": FanoutMatcher,
    "topic": TopicMatcher,
    "headers": HeadersMatcher,
    "failover": FailoverMatcher,
}
