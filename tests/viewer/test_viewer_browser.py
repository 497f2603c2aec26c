"""The viewer in a real headless Chromium: the point cloud is drawn (WebGL through SwiftShader).

Needs Debian's Chromium (/usr/bin/chromium, or MAPSTREAM_CHROMIUM) and the playwright Python
package; `.ci/install_browser.sh` installs both. Skipped with the reason when either is missing.

What is checked: the page loads and connects; a click on the "show cameras" checkbox in the
browser reaches the server (so the frustums, which also show the checkerboard, are hidden);
the screenshot then shows the checkerboard's red and green points, and after the confidence
threshold is raised above every point (a server-side change pushed to the browser) those
colours are gone from a second screenshot. In between, the viewer's own "screenshot" (a render
the server asks the browser for) must show the same colours. Screenshots land in the test's
tmp_path.
"""
from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from viewer_synthetic import CONF_MAX, GREEN, RED, N, make_recon

CHROMIUM = os.environ.get("MAPSTREAM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    # Software WebGL: ANGLE on SwiftShader (viser renders with three.js / WebGL 2).
    "--use-gl=angle", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
]
VIEWPORT = {"width": 960, "height": 640}
MIN_POINT_PIXELS = 5000
"""Pixels of each checkerboard colour expected when the points are drawn (about 33k each are:
flat shading renders the exact colours)."""


def colour_pixels(image: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    """Number of pixels of ``image`` ([H, W, 3+] uint8) within ``tolerance`` of ``rgb`` per channel."""
    diff = np.abs(image[..., :3].astype(np.int16) - np.array(rgb, np.int16))
    return int((diff.max(axis=-1) <= tolerance).sum())


def decode_video(path: Path) -> list[np.ndarray]:
    """The frames of the video at ``path`` as [H, W, 3] uint8 RGB (PyAV; skipped without it)."""
    av = pytest.importorskip("av")
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until true, or fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def test_browser_shows_point_cloud(tmp_path: Path, free_port: int) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (.ci/install_browser.sh)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium not found at {CHROMIUM} (.ci/install_browser.sh installs it)")
    pytest.importorskip("viser")
    from PIL import Image

    from mapstream.viewer import ViewerApp, ViewerOptions

    def screenshot(page: object, name: str) -> np.ndarray:
        path = tmp_path / name
        page.screenshot(path=str(path))  # type: ignore[attr-defined]
        return np.asarray(Image.open(path).convert("RGB"))

    # No "Frame image" panel: its checkerboard would count as drawn points in the page screenshots.
    options = ViewerOptions(conf_threshold=1.0, show_frame_image=False)
    app = ViewerApp(make_recon(), options, port=free_port).start()
    try:
        with sync_api.sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
                args=CHROMIUM_FLAGS, viewport=VIEWPORT,
            )
            try:
                page = context.new_page()
                page.goto(app.url)
                page.wait_for_selector("canvas", timeout=30_000)
                wait_for(lambda: len(app.server.get_clients()) == 1, 30, "the browser to connect")

                assert app.handles is not None
                page.get_by_text("show cameras", exact=True).click()
                wait_for(lambda: app.handles.show_cameras.value is False, 10, "the checkbox click to reach the server")

                state: dict[str, np.ndarray] = {}

                def points_drawn() -> bool:
                    state["shown"] = image = screenshot(page, "viewer_points.png")
                    return min(colour_pixels(image, RED), colour_pixels(image, GREEN)) >= MIN_POINT_PIXELS

                wait_for(points_drawn, 30, "the red and green points in the screenshot")
                status = f"{app.shown_point_count:,} of {len(app.pool):,} points shown"
                assert page.get_by_text(status).count() == 1, f"the panel does not say {status!r}"

                # The viewer's own "screenshot": a render of the page's canvas, written as PNG.
                render = app.screenshot(tmp_path / "viewer_render.png")
                assert render is not None
                render.join(timeout=60)
                rendered = np.asarray(Image.open(tmp_path / "viewer_render.png"))
                assert rendered.shape == (VIEWPORT["height"], VIEWPORT["width"], 4)
                assert min(colour_pixels(rendered, RED), colour_pixels(rendered, GREEN)) >= MIN_POINT_PIXELS

                # "record video": every frame rendered by the browser at 720p (taller than the
                # page: the render is not limited to the canvas), then the scrubber put back.
                app.handles.video_height.value = "720p"
                recording = app.record_video(tmp_path / "viewer.mp4")
                assert recording is not None
                recording.join(timeout=120)
                assert app.handles.status.content.endswith(f"wrote `{tmp_path / 'viewer.mp4'}` ({N} frames)")
                assert app.handles.frame.value == N - 1
                video = decode_video(tmp_path / "viewer.mp4")
                assert len(video) == N and video[0].shape == (720, 1080, 3)  # the 640 x 960 canvas's aspect
                for frame in video:  # JPEG, then H.264: a looser tolerance
                    assert min(colour_pixels(frame, RED, 30), colour_pixels(frame, GREEN, 30)) >= MIN_POINT_PIXELS

                app.handles.conf_threshold.value = CONF_MAX  # every point has confidence <= CONF_MAX
                assert app.shown_point_count == 0

                def points_gone() -> bool:
                    state["hidden"] = image = screenshot(page, "viewer_no_points.png")
                    return max(colour_pixels(image, RED), colour_pixels(image, GREEN)) < MIN_POINT_PIXELS / 5

                wait_for(points_gone, 20, "the points to disappear after raising the threshold")
            finally:
                context.close()
    finally:
        app.stop()

    shown, hidden = state["shown"], state["hidden"]
    changed = (np.abs(shown.astype(np.int16) - hidden).max(axis=-1) > 30).mean()
    assert changed > 0.01, f"only {changed:.2%} of the pixels differ between points shown and hidden"
