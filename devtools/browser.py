"""Debian's Chromium driven by Playwright (never a browser download), opened on a ComfyUI server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import urllib.request

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As root and on a closed network: no sandbox, and no background connections Chromium would try.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-default-apps"]
# Fits the whole graph into the canvas, leaving `inset` screen pixels free at the left and the top (for the
# side bar and the tabs drawn over the canvas); returns the fitted size in screen pixels.
FIT_GRAPH_JS = """
async (inset = [0, 0]) => {
  const nodes = app.graph.nodes;
  const xs = nodes.flatMap((n) => [n.pos[0], n.pos[0] + n.size[0]]);
  const ys = nodes.flatMap((n) => [n.pos[1] - LiteGraph.NODE_TITLE_HEIGHT, n.pos[1] + n.size[1]]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const canvas = app.canvas.canvas;
  const ratio = window.devicePixelRatio || 1;
  const margin = 20;
  const [left, top] = [inset[0] + margin, inset[1] + margin];
  const scale = Math.min((canvas.width / ratio - left - margin) / (x1 - x0),
                         (canvas.height / ratio - top - margin) / (y1 - y0));
  app.canvas.ds.scale = scale;
  app.canvas.ds.offset[0] = left / scale - x0;
  app.canvas.ds.offset[1] = top / scale - y0;
  app.canvas.setDirty(true, true);
  app.canvas.draw(true, true);
  await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));  // two frames drawn
  app.canvas.draw(true, true);
  return { width: (x1 - x0) * scale, height: (y1 - y0) * scale, margin };
}
"""
# The app, the pack's extension, and the workflow the frontend opens with (a first visit gets its default
# graph): a test's own workflow loaded after this is never replaced by it.
READY = ("() => window.app && window.app.graph && window.LiteGraph && window.app.extensions "
         "&& window.app.extensions.some(e => e.name === 'wan22.cachedit') && window.app.graph.nodes.length > 0")


@contextlib.contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        raise RuntimeError("Chromium is missing: run `make setup` (it installs Debian's chromium)")
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


def set_user_settings(url: str, settings: dict) -> None:
    """Settings of the server's user, as the frontend's settings dialog saves them (read when a page opens)."""
    for name, value in settings.items():
        request = urllib.request.Request(f"{url}/settings/{name}", data=json.dumps(value).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30):
            pass


def open_comfyui(instance, url: str, width: int = 1600, height: int = 1000, settings: dict | None = None):
    """A page on the ComfyUI frontend, ready once the app, the pack's extension and the opening workflow
    have loaded. The frontend opens its template browser on a first visit; a returning user's setting skips
    it. `settings`: more user settings, e.g. {"Comfy.VueNodes.Enabled": True} for the Vue-nodes mode."""
    set_user_settings(url, {"Comfy.TutorialCompleted": True, **(settings or {})})
    page = instance.new_page(viewport={"width": width, "height": height})
    page.add_init_script("window.wan22Testing = true;")  # the extension's test counters (window.wan22Canvas)
    page.console_messages_seen = []
    page.on("console", lambda m: page.console_messages_seen.append(f"{m.type}: {m.text}"))
    page.goto(url)
    page.wait_for_function(READY, timeout=120_000)
    return page
