"""One real ComfyUI frontend for the browser tests: Debian's Chromium driven by Playwright against a real
server with tiny stand-ins for every file the shipped workflows name."""

import pytest

from devtools.browser import browser, open_comfyui

from .canvas import wait_for


@pytest.fixture(scope="session")
def server(standin_server):
    return standin_server


@pytest.fixture(scope="module")
def page(server):
    """A page per test module: Playwright's sync API holds an event loop while it runs, and ComfyUI's
    in-process harness needs the thread's loop free once the browser tests are done."""
    with browser() as instance:
        page = open_comfyui(instance, server.url)
        # The frontend loads its default workflow just after start-up: wait for it, so that it cannot land
        # over a test's own workflow later.
        wait_for(page, "app.graph._nodes.length > 0")
        page.wait_for_timeout(500)
        yield page
