"""store/core/queue_args.py: x-queue-type=stream is refused (406) until streams exist -- in every protocol,
since every queue declare is validated here -- while a stream queue an earlier raftmq stored as an
ordinary queue still loads."""

from __future__ import annotations

import pytest

from raftmq.store.core.errors import CommandError
from raftmq.store.core.queue_args import (
    STREAMS_UNSUPPORTED,
    parse_queue_arguments,
    parse_stored_queue_arguments,
)


@pytest.mark.parametrize("value", ["stream", b"stream"])
def test_stream_is_refused(value) -> None:
    with pytest.raises(CommandError) as refused:
        parse_queue_arguments({"x-queue-type": value}, "q", "/")
    assert refused.value.code == 406 and STREAMS_UNSUPPORTED in refused.value.text


def test_classic_and_quorum_are_accepted() -> None:
    assert not parse_queue_arguments({"x-queue-type": "classic"}, "q", "/").delivery_header
    assert parse_queue_arguments({"x-queue-type": "quorum"}, "q", "/").delivery_header


def test_a_stored_stream_queue_still_loads() -> None:
    settings = parse_stored_queue_arguments({"x-queue-type": "stream", "x-max-length": 5}, "q", "/")
    assert settings.max_length == 5
