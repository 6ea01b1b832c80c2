"""The real ComfyUI frontend for the browser tests: Debian's Chromium driven by Playwright against real servers
with tiny stand-ins for every file the shipped workflows name, once on the frontend ComfyUI 0.30.0 pins and
once on the newest one on the package registry."""

import pytest

from devtools.browser import browser, open_comfyui

from .canvas import CANVAS_MODES

FRONTENDS = {"pinned": "standin_server", "newest": "newest_frontend_server"}


@pytest.fixture(scope="session", params=list(FRONTENDS))
def frontend(request):
    return request.param


@pytest.fixture(scope="session")
def server(request, frontend):
    return request.getfixturevalue(FRONTENDS[frontend])


@pytest.fixture(scope="module")
def page(request, server):
    """A page per test module, in the classic canvas unless the module asks for another mode
    (`pytest.mark.parametrize("page", ["vue"], indirect=True)`); `page.canvas_mode` names it. Playwright's sync
    API holds an event loop while it runs, and ComfyUI's in-process harness needs the thread's loop free once
    the browser tests are done."""
    mode = getattr(request, "param", "classic")
    vue_nodes = CANVAS_MODES[mode]
    with browser() as instance:
        page = open_comfyui(instance, server.url, settings={"Comfy.VueNodes.Enabled": vue_nodes})
        page.canvas_mode = mode
        if vue_nodes:
            assert page.evaluate("() => document.querySelectorAll('[data-node-id]').length") > 0  # Vue nodes shown
        yield page
    if vue_nodes:
        server.post("/settings/Comfy.VueNodes.Enabled", False)
