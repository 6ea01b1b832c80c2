"""Debian's Chromium driven by Playwright (never a browser download), opened on a ComfyUI server."""

from __future__ import annotations

import contextlib
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
  const nodes = app.graph._nodes;
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
  await new Promise((resolve) => setTimeout(resolve, 300));
  app.canvas.draw(true, true);
  return { width: (x1 - x0) * scale, height: (y1 - y0) * scale, margin };
}
"""
READY = ("() => window.app && window.app.graph && window.LiteGraph && window.app.extensions "
         "&& window.app.extensions.some(e => e.name === 'wan22.cachedit')")


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


def skip_first_run_dialogs(url: str) -> None:
    """The frontend opens its template browser on a first visit; a returning user's setting skips it."""
    request = urllib.request.Request(f"{url}/settings/Comfy.TutorialCompleted", data=b"true", method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30):
        pass


def open_comfyui(instance, url: str, width: int = 1600, height: int = 1000):
    """A page on the ComfyUI frontend, ready once the app and the pack's extension have loaded."""
    skip_first_run_dialogs(url)
    page = instance.new_page(viewport={"width": width, "height": height})
    page.console_messages_seen = []
    page.on("console", lambda m: page.console_messages_seen.append(f"{m.type}: {m.text}"))
    page.goto(url)
    page.wait_for_function(READY, timeout=120_000)
    return page
