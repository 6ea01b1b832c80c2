"""The server's note (WAN22_SERVER_NOTE, what `make demo` uses to say which workflows its stand-ins run) on the
canvas: shown when the page opens and again after a failed run, as text."""

import json

from devtools.browser import READY

NOTE = "only the demo workflow runs on this server <b>(a test's note)</b>"


def test_the_servers_note_shows_when_the_page_opens_and_after_a_failed_run(page, server):
    noted = page.context.browser.new_page()

    def with_note(route):  # the server's own answer, with the note an operator set
        answer = route.fetch().json()
        assert answer["server_note"] is None  # this server has none
        route.fulfill(json={**answer, "server_note": NOTE})

    try:
        noted.route("**/wan22/canvas", with_note)
        noted.goto(server.url)
        noted.wait_for_function(READY, timeout=120_000)
        shown = noted.get_by_text(NOTE, exact=False)
        shown.first.wait_for(timeout=60_000)  # a hang guard
        assert noted.locator("b", has_text="(a test's note)").count() == 0  # shown as text, markup not rendered
        noted.evaluate("""() => {
            for (const close of document.querySelectorAll('.p-toast-close-button')) close.click();
        }""")
        shown.first.wait_for(state="detached", timeout=60_000)
        noted.evaluate(f"""() => window.comfyAPI.api.api.dispatchEvent(new CustomEvent("execution_error",
            {{detail: {json.dumps({"prompt_id": "x", "node_id": "1", "exception_message": "failed"})}}}))""")
        shown.first.wait_for(timeout=60_000)
    finally:
        noted.close()
    assert page.get_by_text(NOTE, exact=False).count() == 0  # a page of a server without a note shows none
