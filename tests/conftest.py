"""Fixtures shared by test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture
def flower_identity() -> Iterator[None]:
    """Messages made outside a running app need an identity; restored afterwards."""
    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before
