"""What the browser tests do on the canvas: load a workflow, read a node, wait for the page."""

import time


def load(page, workflow):
    page.evaluate("async (wf) => { await app.loadGraphData(wf); }", workflow)
    page.wait_for_timeout(500)


def node_of(page, node_type, expression):
    return page.evaluate(f"() => {{ const node = app.graph._nodes.find(n => n.type === '{node_type}'); "
                         f"return {expression}; }}")


def wait_for(page, expression, timeout=300.0):
    """Polls a JavaScript expression until it is truthy; the timeout only guards against a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = page.evaluate(f"() => {expression}")
        if value:
            return value
        page.wait_for_timeout(100)
    raise TimeoutError(f"{expression} stayed false for {timeout} s")


def frontend_prompt(page):
    """The frontend's own workflow -> API conversion of the graph on the canvas."""
    return page.evaluate("async () => (await app.graphToPrompt()).output")
