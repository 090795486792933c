"""The WHEP-style aiohttp endpoint the server side of each benchmark runs on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve_until_cancelled(
    routes: list[tuple[str, str, Handler]], port: int, cleanup: Callable[[], Awaitable[None]]
) -> None:
    """Serve ``(method, path, handler)`` routes on 127.0.0.1:``port``, print ``ready`` (the
    client process waits for it), and run ``cleanup`` when cancelled."""
    app = web.Application()
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await cleanup()
        await runner.cleanup()


async def serve_app_until_cancelled(
    app: web.Application, port: int, cleanup: Callable[[], Awaitable[None]]
) -> None:
    """Like :func:`serve_until_cancelled` for a ready-made application."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await cleanup()
        await runner.cleanup()
