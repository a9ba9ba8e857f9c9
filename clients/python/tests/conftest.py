from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fake import FakeServer


@pytest.fixture
def servers() -> Iterator[Callable[..., FakeServer]]:
    """Starts fake servers (ids from 1_000_001, 2_000_001, ...); stops them after."""
    started: list[FakeServer] = []

    def start(steps: list[object] | None = None, **kw: object) -> FakeServer:
        fake = FakeServer(first_id=(len(started) + 1) * 1_000_000 + 1, **kw)  # type: ignore[arg-type]
        if steps is not None:
            fake.steps = list(steps)
        started.append(fake.start())
        return fake

    yield start
    for fake in started:
        fake.stop()
