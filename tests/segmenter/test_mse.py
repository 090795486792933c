"""Chromium's Media Source Extensions play what the segmenter writes (Debian's Chromium)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ruseon_appliance.segmenter import Fmp4Segmenter
from tests.e2e.browser_netns import CHROMIUM, chromium
from tests.tooling import IN_CI

from .stream import encode, segment

PAGE = """<!doctype html><video id="v" muted playsinline></video><script>
window.result = {error: null, supported: null};
async function play(codec, generations) {
  const v = document.getElementById('v');
  const type = 'video/mp4; codecs="' + codec + '"';
  window.result.supported = MediaSource.isTypeSupported(type);
  const ms = new MediaSource();
  v.src = URL.createObjectURL(ms);
  await new Promise((r) => ms.addEventListener('sourceopen', r, {once: true}));
  const sb = ms.addSourceBuffer(type);
  v.addEventListener('error', () => { window.result.error = String(v.error && v.error.message); });
  for (const name of generations) {
    for (const part of ['init', 'media']) {
      const body = await (await fetch(name + '.' + part)).arrayBuffer();
      sb.appendBuffer(body);
      await new Promise((r) => sb.addEventListener('updateend', r, {once: true}));
    }
  }
  ms.endOfStream();
  await v.play();
}
</script>"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """A static HTTP server on 127.0.0.1 for ``directory``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_chromium_mse_plays_init_and_fragments_across_a_resolution_change(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        if IN_CI:
            pytest.fail(f"{CHROMIUM} is not installed")
        pytest.skip(f"{CHROMIUM} is not installed")
    seg = Fmp4Segmenter(fragment_max_s=0.25)
    first = encode(45, width=320, height=192, gop=15)
    fragments = segment(first, seg)
    assert seg.init_segment is not None and seg.codec is not None
    (tmp_path / "a.init").write_bytes(seg.init_segment)
    (tmp_path / "a.media").write_bytes(b"".join(f.data for f in fragments))
    # A new resolution (SPS change) continues the timeline with a new init generation.
    second = encode(45, width=256, height=144, gop=15, first_frame=45)
    fragments = segment(second, seg)
    assert seg.init_generation == 1 and {f.init_generation for f in fragments} == {1}
    (tmp_path / "b.init").write_bytes(seg.init_segment)
    (tmp_path / "b.media").write_bytes(b"".join(f.data for f in fragments))
    (tmp_path / "index.html").write_text(PAGE)
    with serve(tmp_path) as url, chromium() as browser:
        page = browser.new_page()
        page.goto(url + "index.html")
        page.evaluate("([codec, g]) => play(codec, g)", [seg.codec, ["a", "b"]])
        page.wait_for_function(
            "() => window.result.error !== null || document.getElementById('v').ended"
            " || document.getElementById('v').currentTime > 2.5", timeout=60_000)
        state = page.evaluate("""() => { const v = document.getElementById('v');
            return {error: window.result.error, supported: window.result.supported,
                    time: v.currentTime, width: v.videoWidth,
                    buffered: v.buffered.length ? v.buffered.end(0) : 0,
                    decoded: v.getVideoPlaybackQuality().totalVideoFrames}; }""")
    assert state["supported"] is True
    assert state["error"] is None, state
    assert state["time"] > 2.5, state
    assert state["buffered"] == pytest.approx(3.0, abs=0.05), state
    assert state["decoded"] >= 70, state
    assert state["width"] == 256, state  # playing the second generation now
