"""What the browser tests do on the canvas, through the frontend's public graph calls: load a workflow, read a
node (in the root graph or inside a subgraph), change a widget as the canvas does, wait for the page."""

import json
import time

# A node of the graph on screen by type, searched through every subgraph: `node` in the expression.
FIND = """
const find = (type) => {
  const graphs = [app.rootGraph ?? app.graph, ...((app.rootGraph ?? app.graph).subgraphs?.values() ?? [])];
  for (const graph of graphs) for (const node of graph.nodes) if (node.type === type) return node;
  return null;
};
"""
# The frontend's canvas modes: the classic litegraph canvas, and Vue nodes (nodes as DOM elements), as
# mode -> its Comfy.VueNodes.Enabled setting.
CANVAS_MODES = {"classic": False, "vue": True}
STATUS = "node.widgets.find(w => w.name === 'wan22_status').element.textContent"


def load(page, workflow):
    """Loads a workflow as a dropped file is loaded; the canvas then asks for its splits."""
    page.evaluate("async (wf) => { await app.loadGraphData(wf); }", workflow)


def node_of(page, node_type, expression):
    return page.evaluate(f"() => {{ {FIND} const node = find({json.dumps(node_type)}); return {expression}; }}")


def status_of(page, node_type):
    """The text the pack's status widget shows on a node (the live split, what the last run did)."""
    return node_of(page, node_type, STATUS)


# The status widget's element as the user sees it in the Vue-nodes mode: inside the node's own element, laid out,
# not hidden.
SHOWN = """
const element = node.widgets.find(w => w.name === 'wan22_status').element;
const box = element.getBoundingClientRect();
const host = document.querySelector(`[data-node-id="${node.id}"]`);
return { text: element.textContent, inNode: !!host && host.contains(element),
         shown: element.offsetParent !== null && box.width > 0 && box.height > 0 };
"""


def shown(page, node_type):
    return node_of(page, node_type, f"(() => {{ {SHOWN} }})()")


def set_widget(page, node_type, name, value):
    """Sets a widget as the canvas does when a user changes it (the node's callbacks run)."""
    page.evaluate(f"""(value) => {{ {FIND}
        const node = find({json.dumps(node_type)});
        node.widgets.find(w => w.name === {json.dumps(name)}).setValue(value, {{ node, canvas: app.canvas }});
    }}""", value)


def wait_for(page, expression, timeout=300.0):
    """Polls a JavaScript expression (with `find(type)` at hand) until it is truthy; the timeout only guards
    against a hang."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = page.evaluate(f"() => {{ {FIND} return {expression}; }}")
        if value:
            return value
        page.wait_for_timeout(100)
    raise TimeoutError(f"{expression} stayed false for {timeout} s")


def wait_until(page, condition, timeout=300.0):
    """Waits until a Python-side condition holds (a request reached the test, the queue emptied), letting the
    page run meanwhile; the timeout only guards against a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{condition} stayed false for {timeout} s")
        page.wait_for_timeout(50)


def wait_for_status(page, node_type, fragment, timeout=300.0):
    """Waits until the node's status text contains `fragment`; returns the text."""
    return wait_for(page, f"(t => t.includes({json.dumps(fragment)}) && t)"
                          f"(find({json.dumps(node_type)})?.widgets.find(w => w.name === 'wan22_status')"
                          f"?.element.textContent ?? '')", timeout)


def replies_handled(page) -> int:
    """How many replies of the live-split route the canvas has handled so far (applied, or dropped as stale)."""
    return page.evaluate("() => window.wan22Canvas.handled")


def frontend_prompt(page):
    """The frontend's own workflow -> API conversion of the graph on the canvas."""
    return page.evaluate("async () => (await app.graphToPrompt()).output")


# Names a hostile workflow carries: markup that would run if the canvas inserted a server text as HTML.
HOSTILE_SCHEDULER = "<script>window.wan22Injected = 1</script>"
HOSTILE_MODEL = "<img src=x onerror=\"window.wan22Injected = 1\">.safetensors"


def hostile_names_show_as_text(page, workflow) -> list[dict]:
    """Loads `workflow`, gives its loader a model name that is markup, then its schedule a scheduler name that
    is markup, and returns what the schedule's status shows each time the live-split route has answered: its
    text, how many elements it holds, the markup elements in any status, whether any markup ran."""
    load(page, workflow)
    wait_for_status(page, "Wan22Schedule", "will run:")
    page.evaluate("() => { delete window.wan22Injected; }")
    shown = []
    for node_type, name, value, fragment in (
            ("Wan22ExpertLoader", "high_noise_model", HOSTILE_MODEL, HOSTILE_MODEL),
            ("Wan22Schedule", "scheduler", HOSTILE_SCHEDULER, HOSTILE_SCHEDULER)):
        set_widget(page, node_type, name, value)
        wait_for_status(page, "Wan22Schedule", fragment)
        shown.append(node_of(page, "Wan22Schedule", f"""(() => {{
            const element = node.widgets.find(w => w.name === 'wan22_status').element;
            return {{ text: {STATUS}, children: element.children.length, injected: window.wan22Injected ?? null,
                      markup: document.querySelectorAll('.wan22-status script, .wan22-status img').length }};
        }})()"""))
    return shown
