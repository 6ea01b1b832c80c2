"""Builds the shipped workflows inside the real ComfyUI frontend: each spec becomes a graph made with
LiteGraph's own node factory, saved as the frontend serialises it (UI format, for the canvas and the
template list), converted by the frontend's own graphToPrompt (API format, under example_workflows/api),
and photographed for the template thumbnail.

    .venv/bin/python -m devtools.build_workflows [name ...]   (all of them when no name is given)
"""

from __future__ import annotations

import base64
import io
import json
import os
import tempfile

from PIL import Image

from .browser import FIT_GRAPH_JS, browser, open_comfyui
from .comfy_server import ComfyServer
from .paths import ROOT
from .standins import write_standins
from .workflow_specs import WORKFLOWS

OUT = os.path.join(ROOT, "example_workflows")
THUMBNAIL_WIDTH = 640

BUILD_JS = """
async (spec) => {
  app.graph.clear();
  const made = {};
  for (const n of spec.nodes) {
    const node = LiteGraph.createNode(n.type);
    if (!node) throw new Error(`unknown node type ${n.type}`);
    node.id = n.id;
    node.pos = n.pos;
    if (n.title) node.title = n.title;
    app.graph.add(node);
    for (const [name, value] of Object.entries(n.widgets)) {
      const widget = node.widgets?.find((w) => w.name === name);
      if (!widget) throw new Error(`${n.type} has no widget ${name}`);
      widget.value = value;
      widget.callback?.(value);
    }
    made[n.id] = node;
  }
  for (const n of spec.nodes) {
    for (const [input, [source, slot]] of Object.entries(n.links)) {
      const target = made[n.id];
      const index = target.findInputSlot(input);
      if (index < 0) throw new Error(`${n.type} has no input ${input}`);
      if (!made[source].connect(slot, target, index)) throw new Error(`cannot link ${source} -> ${n.type}.${input}`);
    }
  }
  app.graph.setDirtyCanvas(true, true);
  await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));  // laid out
  const workflow = app.graph.serialize();
  if (workflow.nodes.length !== spec.nodes.length) throw new Error("the graph was replaced while building");
  const { output } = await app.graphToPrompt();
  return { workflow, output };
}
"""

SNAPSHOT_JS = """
async () => {
  // The canvas pixels alone (no DOM overlays), cropped to the fitted graph.
  const margin = await fitGraph();
  const canvas = app.canvas.canvas;
  const ratio = window.devicePixelRatio || 1;
  const crop = document.createElement("canvas");
  crop.width = Math.ceil((margin.width + 2 * margin.margin) * ratio);
  crop.height = Math.ceil((margin.height + 2 * margin.margin) * ratio);
  crop.getContext("2d").drawImage(canvas, 0, 0);
  return crop.toDataURL("image/png");
}
""".replace("await fitGraph()", "await (" + FIT_GRAPH_JS.strip() + ")([0, 0])")


def build(page, name: str, spec: dict) -> None:
    result = page.evaluate(BUILD_JS, spec)
    workflow = result["workflow"]
    workflow["models"] = spec["models"]
    with open(os.path.join(OUT, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(workflow, f, indent=2)
        f.write("\n")
    os.makedirs(os.path.join(OUT, "api"), exist_ok=True)
    with open(os.path.join(OUT, "api", f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(result["output"], f, indent=2)
        f.write("\n")
    data_url = page.evaluate(SNAPSHOT_JS)
    shot = Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))).convert("RGB")
    shot.thumbnail((THUMBNAIL_WIDTH, THUMBNAIL_WIDTH))
    shot.save(os.path.join(OUT, f"{name}.jpg"), quality=85)
    print(f"[workflows] {name}: {len(workflow['nodes'])} nodes, {len(workflow['links'])} links")


def main(names: list[str]) -> int:
    unknown = set(names) - set(WORKFLOWS)
    if unknown:
        raise SystemExit(f"unknown workflow(s) {', '.join(sorted(unknown))}; known: {', '.join(WORKFLOWS)}")
    with tempfile.TemporaryDirectory(prefix="wan22-build-") as base:
        write_standins(os.path.join(base, "models"), os.path.join(base, "input"))
        with ComfyServer(base) as server, browser() as instance:
            page = open_comfyui(instance, server.url, width=1800, height=1000)
            for name, make in WORKFLOWS.items():
                if not names or name in names:
                    build(page, name, make())
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
