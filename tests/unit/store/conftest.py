"""Every state machine test runs twice: with ready lists as they are in production, and with
ready lists that freeze every few entries into FrozenRuns (store/core/frozen.py), so that each
operation meets frozen entries wherever they can be (head, middle, browsed, acquired, purged,
snapshotted, digested)."""

from __future__ import annotations

import pytest

from raftmq.store.core import model


@pytest.fixture(autouse=True, params=[model.FREEZE_BATCH, 2], ids=["ready", "frozen"])
def freeze_batch(request, monkeypatch):
    monkeypatch.setattr(model, "FREEZE_BATCH", request.param)
    return request.param
