"""Behind a trusted reverse proxy a WHEP offer counts against the client the proxy names.

Real HTTP over loopback: the "proxy" is a client bound to 127.0.0.2 (``http.trusted_proxies``),
a stranger is one bound to 127.0.0.3; one place per address makes the counting visible.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.web.conftest import Viewer, new_offer, running_device, web_config

TOKEN = "proxy-test-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/sdp"}


async def test_an_offer_through_a_trusted_proxy_counts_against_the_forwarded_address(
        tmp_path: Path) -> None:
    config = web_config(auth={"token": TOKEN}, http={"trusted_proxies": ("127.0.0.2",)},
                        webrtc={"max_viewers_per_address": 1})
    viewers: list[Viewer] = []
    async with running_device(config, tmp_path) as (_capture, engine, client):
        url = str(client.make_url("/whep"))

        def from_address(host: str) -> aiohttp.ClientSession:
            return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(host, 0)))

        async def post(http: aiohttp.ClientSession, forwarded_for: str) -> tuple[int, str]:
            _, offer = await new_offer(viewers)
            async with http.post(url, data=offer, headers={
                    **HEADERS, "X-Forwarded-For": forwarded_for}) as response:
                location = response.headers.get("Location", "")
                return response.status, location.rsplit("/", 1)[-1]

        proxy, stranger = from_address("127.0.0.2"), from_address("127.0.0.3")
        try:
            status, first = await post(proxy, "203.0.113.50, 198.51.100.7")
            assert status == 201
            assert engine.sessions[first].remote_key == "198.51.100.7"
            # The same client again: its one place is taken.
            assert (await post(proxy, "198.51.100.7"))[0] == 429
            # Another client behind the same proxy is another address.
            status, second = await post(proxy, "198.51.100.8")
            assert status == 201
            assert engine.sessions[second].remote_key == "198.51.100.8"
            # From an address that is not a trusted proxy the header is ignored: it counts
            # against its own address, whatever it claims.
            status, third = await post(stranger, "198.51.100.9")
            assert status == 201
            assert engine.sessions[third].remote_key == "127.0.0.3"
            assert (await post(stranger, "198.51.100.10"))[0] == 429
            assert engine.stats()["places_refused"] == {"address-share": 2}
        finally:
            await proxy.close()
            await stranger.close()
            for viewer in viewers:
                await viewer.close()
