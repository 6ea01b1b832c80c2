"""One real ComfyUI frontend for the browser tests: Debian's Chromium driven by Playwright against a real
server with tiny stand-ins for every file the shipped workflows name."""

import pytest

from devtools.browser import browser, open_comfyui


@pytest.fixture(scope="session")
def server(standin_server):
    return standin_server


@pytest.fixture(scope="session")
def page(server):
    with browser() as instance:
        page = open_comfyui(instance, server.url)
        page.wait_for_timeout(2000)  # the frontend loads its default workflow just after start-up
        yield page
