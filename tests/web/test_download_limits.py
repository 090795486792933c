"""``/recordings/get`` admission: a limit per client address and in total, 503 + Retry-After
beyond; a finished download frees its place."""

from __future__ import annotations

import types
from typing import Any

import pytest

from ruseon_appliance.web.problem import Problem
from ruseon_appliance.web.recordings import RecordingsResource


def _request(address: str) -> Any:
    return types.SimpleNamespace(remote=address)


async def test_downloads_are_limited_per_address_and_in_total() -> None:
    resource = RecordingsResource(None, max_downloads=3,  # type: ignore[arg-type]
                                  max_downloads_per_address=2)
    try:
        a1 = resource._admit(_request("192.0.2.1"))
        resource._admit(_request("192.0.2.1"))
        with pytest.raises(Problem) as refused:
            resource._admit(_request("192.0.2.1"))
        assert refused.value.status == 503
        assert "per address" in str(refused.value.detail)
        assert dict(refused.value.headers or {}).get("Retry-After") == "5"
        resource._admit(_request("192.0.2.2"))
        with pytest.raises(Problem) as full:  # 3 in total
            resource._admit(_request("192.0.2.3"))
        assert "in total" in str(full.value.detail)
        resource._release(a1)
        resource._admit(_request("192.0.2.3"))
        assert resource.downloads_refused == 2
    finally:
        await resource.close()
