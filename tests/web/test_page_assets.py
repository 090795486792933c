"""Every file the device page loads, found by following index.html and the modules' imports: the
board serves it without the token, as JavaScript or CSS with the static files' validators, and
the package data that wheels and the image are built from takes it along."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from ruseon_appliance.engine.engine import Engine
from ruseon_appliance.web.app import STATIC_DIR

Device = tuple[Any, Engine, TestClient[Any, Any]]
REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "ruseon_appliance"
WITH_TOKEN = [{"auth": {"token": "page-assets-token"}}]

# <script src=...> and <link href=...> under /static/ in the page; import ... from "./x.js"
# (and bare import "./x.js") in a module.
PAGE_ASSET = re.compile(r'(?:src|href)="(/static/[^"]+)"')
MODULE_IMPORT = re.compile(r'^\s*import\s+(?:[^"\']*?\bfrom\s+)?["\'](\./[^"\']+)["\']', re.M)
JS_TYPES = {"text/javascript", "application/javascript"}


def page_assets() -> list[str]:
    """The /static/ paths the page loads: index.html's, then every module's imports, in turn."""
    found = PAGE_ASSET.findall((STATIC_DIR / "index.html").read_text())
    queue = [p for p in found if p.endswith(".js")]
    while queue:
        path = queue.pop()
        source = (STATIC_DIR / path.removeprefix("/static/")).read_text()
        for relative in MODULE_IMPORT.findall(source):
            url = "/static/" + relative.removeprefix("./")
            if url not in found:
                found.append(url)
                queue.append(url)
    return found


def test_the_page_graph_includes_the_shared_module() -> None:
    assets = page_assets()
    # What every page module imports, and the modules index.html names (the graph is followed).
    assert "/static/page.js" in assets and "/static/whep.js" in assets
    assert {"/static/device.js", "/static/controls.js", "/static/cameras.js"} <= set(assets)


@pytest.mark.parametrize("device", WITH_TOKEN, indirect=True)
async def test_every_page_asset_is_served_like_a_static_file(device: Device) -> None:
    _, _, client = device
    for path in page_assets():
        response = await client.get(path)  # no token: the page must load before one is typed
        assert response.status == 200, path
        kind = response.headers["Content-Type"].split(";")[0]
        if path.endswith(".js"):
            assert kind in JS_TYPES, (path, kind)  # module scripts need a JavaScript MIME type
        else:
            assert kind == "text/css", (path, kind)
        # The same validators as every static file: a reload can revalidate instead of refetch.
        assert response.headers.get("ETag") and response.headers.get("Last-Modified"), path
        again = await client.get(path, headers={"If-None-Match": response.headers["ETag"]})
        assert again.status == 304, path


def test_package_data_takes_every_page_asset_along() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["ruseon_appliance"]
    for path in ["/static/index.html", *page_assets()]:
        relative = (STATIC_DIR / path.removeprefix("/static/")).relative_to(PACKAGE).as_posix()
        # setuptools globs: "*" stays within one folder, as PurePosixPath.match has it.
        assert any(PurePosixPath(relative).match(p) for p in patterns), (relative, patterns)
