"""Exchange-type matching (0-9-1 reference, exchange types direct/fanout/topic/headers)."""

import pytest

from raftmq.store.core.routing import Binding, DirectMatcher, FanoutMatcher, HeadersMatcher, TopicMatcher


def _b(key, dest="q", args=None):
    return Binding("x", True, dest, key, args or {})


@pytest.mark.parametrize(
    "pattern, key, expected",
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("*.b.c", "a.b.c", True),
        ("*.b.c", "b.c", False),
        ("a.*", "a", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("#", "", True),
        ("#", "a.b.c", True),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("a.#", "b.a", False),
        ("#.c", "c", True),
        ("#.c", "a.b.c", True),
        ("#.c", "a.b.c.d", False),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.x.y.c", True),
        ("a.*.#", "a", False),
        ("a.*.#", "a.b", True),
        ("#.#", "a", True),
        ("", "", True),
        ("", "a", False),
        ("a..b", "a..b", True),
        ("*", "", True),
    ],
)
def test_topic_patterns(pattern, key, expected):
    """Reference 1.6 exchange type topic: '*' is exactly one word, '#' zero or more words."""
    matcher = TopicMatcher([_b(pattern)])
    assert bool(matcher.match(key, dict)) is expected


def test_topic_returns_each_binding_once_in_binding_order():
    bindings = [_b("#", "q1"), _b("a.*", "q2"), _b("a.#", "q3"), _b("#.b", "q4")]
    matched = TopicMatcher(bindings).match("a.b", dict)
    assert [b.destination for b in matched] == ["q1", "q2", "q3", "q4"]


def test_direct_and_fanout():
    bindings = [_b("k1", "q1"), _b("k2", "q2"), _b("k1", "q3")]
    assert [b.destination for b in DirectMatcher(bindings).match("k1", dict)] == ["q1", "q3"]
    assert [b.destination for b in FanoutMatcher(bindings).match("zzz", dict)] == ["q1", "q2", "q3"]


@pytest.mark.parametrize(
    "args, headers, expected",
    [
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
        ({"x-match": "any", "a": 1, "b": "x"}, {"a": 1}, True),
        ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2}, False),
        ({"a": 1}, {"a": 1}, True),  # all is the default
        ({"x-match": "all"}, {}, True),
        ({"x-match": "any"}, {"a": 1}, False),
        ({"x-match": "all", "x-k": 1}, {}, True),  # x- keys ignored unless *-with-x
        ({"x-match": "all-with-x", "x-k": 1}, {}, False),
        ({"x-match": "any-with-x", "x-k": 1}, {"x-k": 1}, True),
        ({"x-match": "all", "a": None}, {"a": "anything"}, True),  # void value: presence only
    ],
)
def test_headers_matching(args, headers, expected):
    """Reference 1.6 exchange type headers: x-match all / any."""
    matched = HeadersMatcher([_b("", args=args)]).match("", lambda: headers)
    assert bool(matched) is expected
