"""The console's reads run as the signed-in principal, under the roles the gRPC interceptor enforces."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from coordinator.api.auth import Principal, acting_as, current_principal
from coordinator.web.reader import Reader, WebRefused


def test_acting_as_sets_the_principal_for_the_block_only() -> None:
    vera = Principal("vera", "viewer", "token")
    with acting_as(vera):
        assert current_principal() is vera
    assert current_principal() is None


@pytest.mark.parametrize("method", ["TaskLogs", "CancelTask", "SetPolicy"])
def test_a_viewer_is_refused_what_its_role_may_not_call_before_the_servicer_runs(method: str) -> None:
    reader = Reader(admin=None)   # type: ignore[arg-type]  # never reached: the role check refuses first
    vera = Principal("vera", "viewer", "token")

    async def read() -> None:
        async for _ in reader.stream(vera, method, None):
            pass
    for attempt in (lambda: asyncio.run(reader.call(vera, method, None)), lambda: asyncio.run(read())):
        with pytest.raises(WebRefused) as refused:
            attempt()
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED and refused.value.http_status == 403
        assert f"{method} needs role" in str(refused.value)
