"""The real ComfyUI frontend for the browser tests: Debian's Chromium driven by Playwright against real servers
with tiny stand-ins for every file the shipped workflows name, once on the frontend ComfyUI 0.30.0 pins and
once on the newest one on the package registry."""

import pytest

from devtools.browser import browser, open_comfyui

FRONTENDS = {"pinned": "standin_server", "newest": "newest_frontend_server"}


@pytest.fixture(scope="session", params=list(FRONTENDS))
def frontend(request):
    return request.param


@pytest.fixture(scope="session")
def server(request, frontend):
    return request.getfixturevalue(FRONTENDS[frontend])


@pytest.fixture(scope="module")
def page(server):
    """A page per test module: Playwright's sync API holds an event loop while it runs, and ComfyUI's
    in-process harness needs the thread's loop free once the browser tests are done."""
    with browser() as instance:
        yield open_comfyui(instance, server.url, settings={"Comfy.VueNodes.Enabled": False})
