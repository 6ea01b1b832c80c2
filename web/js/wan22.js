// Wan2.2 Cache-DiT on the canvas: socket colours, the schedule's split shown live as its widgets
// change (computed on the server by the node's own function), boundary_ratio only when the boundary is
// custom, old sampler names shown as the ComfyUI samplers they now run, and what each node reported after
// a run (the split, the cache savings).
import { app } from "../../../scripts/app.js";
import { api } from "../../../scripts/api.js";

const EXPERTS = "WAN22_EXPERTS";
const SOCKET_COLOURS = { WAN22_EXPERTS: "#b06ad9", WAN22_SCHEDULE: "#3fb6a8" };
// What the server's node definitions say, collected as they register: nodes that make experts, and nodes
// that take experts and give experts back (Cache-DiT, LoRA, any future one).
const LOADERS = new Set();
const PASS_THROUGH = new Set();
const BRIDGE = "Wan22ExpertsFromModel";
const EXPERT_INPUTS = { high: "high_noise_model", low: "low_noise_model" };
// Workflows saved before the pack ran ComfyUI's own samplers (the server maps them the same way).
const OLD_SAMPLERS = { unipc: "uni_pc", dpmpp: "dpmpp_2m" };
const LINE_HEIGHT = 16;
const PREVIEW_DELAY_MS = 150;

function typeOf(node) {
  return node?.type ?? node?.comfyClass;
}

function widgetValues(node) {
  return Object.fromEntries((node.widgets ?? []).map((w) => [w.name, w.value]));
}

function sourceOf(node, inputName) {
  const input = node.inputs?.find((i) => i.name === inputName);
  if (input?.link == null) return null;
  return node.graph?.getNodeById(node.graph.links[input.link]?.origin_id) ?? null;
}

// The node that makes the experts behind a node's experts input, through any pass-through nodes.
function upstreamLoader(node) {
  let current = node;
  for (let hops = 0; hops < 32 && current; hops++) {
    const source = sourceOf(current, "experts");
    if (!source) return null;
    if (LOADERS.has(typeOf(source))) return source;
    if (!PASS_THROUGH.has(typeOf(source))) return null;
    current = source;
  }
  return null;
}

// For the MODEL bridge: per expert, null when unconnected, else the file of the loader behind it (through
// LoRA loaders and model patches), when one can be found.
function bridgedModels(bridge) {
  const models = {};
  for (const [role, inputName] of Object.entries(EXPERT_INPUTS)) {
    let source = sourceOf(bridge, inputName);
    models[role] = source ? {} : null;
    for (let hops = 0; hops < 32 && source; hops++) {
      const unet = source.widgets?.find((w) => w.name === "unet_name");
      if (unet) {
        models[role] = { unet_name: unet.value };
        break;
      }
      source = sourceOf(source, "model");
    }
  }
  return models;
}

function loaderBody(loader) {
  const type = typeOf(loader);
  return type === BRIDGE ? { type, models: bridgedModels(loader) } : { type, values: widgetValues(loader) };
}

function setLines(node, key, text) {
  node[key] = text;
  const lines = [node.wan22Preview, node.wan22Result].filter(Boolean).join("\n").split("\n").length;
  const needed = node.computeSize()[1] + lines * LINE_HEIGHT + 8;
  if (node.size[1] < needed) node.setSize([node.size[0], needed]);
  node.setDirtyCanvas(true, true);
}

async function refreshPreview(node) {
  const ticket = (node.wan22Ticket = (node.wan22Ticket ?? 0) + 1); // a reply still on its way is now stale
  const loader = upstreamLoader(node);
  if (!loader) {
    node.wan22Split = null;
    setLines(node, "wan22Preview", "connect a Wan2.2 expert loader to see the split");
    return;
  }
  const body = { loader: loaderBody(loader), ...widgetValues(node) };
  try {
    const response = await api.fetchApi("/wan22/split", { method: "POST", body: JSON.stringify(body) });
    const answer = await response.json();
    if (ticket !== node.wan22Ticket) return; // a newer change is on its way
    const text = answer.error
      ? `split: ${answer.error}`
      : `will run: ${answer.high} high / ${answer.low} low` +
        (answer.boundary_ratio == null ? ` (${answer.boundary_source.replaceAll("_", " ")})`
                                       : ` (boundary ${answer.boundary_ratio}, ${answer.boundary_source.replace("_", " ")}` +
                                         (answer.boundary_known ? ")" : ", text-to-video assumed)"));
    node.wan22Split = answer.error ? null : answer;
    setLines(node, "wan22Preview", text);
  } catch (error) {
    setLines(node, "wan22Preview", `split: ${error}`);
  }
}

function schedulePreview(node) {
  clearTimeout(node.wan22Timer);
  node.wan22Timer = setTimeout(() => refreshPreview(node), PREVIEW_DELAY_MS);
}

function showBoundaryRatio(node) {
  const boundary = node.widgets?.find((w) => w.name === "boundary");
  const ratio = node.widgets?.find((w) => w.name === "boundary_ratio");
  if (!boundary || !ratio) return;
  const hidden = boundary.value !== "custom";
  if (ratio.hidden === hidden) return;
  ratio.hidden = hidden;
  node.setSize([node.size[0], node.computeSize()[1]]);
  node.setDirtyCanvas(true, true);
}

function refreshSchedulesOf(graph) {
  for (const node of graph?._nodes ?? []) {
    if (typeOf(node) === "Wan22Schedule") schedulePreview(node);
  }
}

function showNewSamplerName(node) {
  const sampler = node.widgets?.find((w) => w.name === "sampler");
  if (sampler && OLD_SAMPLERS[sampler.value]) sampler.value = OLD_SAMPLERS[sampler.value];
}

function onWidgetChange(node, handler) {
  for (const widget of node.widgets ?? []) {
    const original = widget.callback;
    widget.callback = function () {
      const result = original?.apply(this, arguments);
      handler(widget);
      return result;
    };
  }
}

function chain(nodeType, method, extra) {
  const original = nodeType.prototype[method];
  nodeType.prototype[method] = function () {
    const result = original?.apply(this, arguments);
    extra.apply(this, arguments);
    return result;
  };
}

app.registerExtension({
  name: "wan22.cachedit",

  async setup() {
    // The colour palette rewrites these tables when it loads, blanking types it does not know; keep
    // our colours unless a palette sets a real colour of its own for our types.
    for (const table of [LGraphCanvas.link_type_colors, app.canvas?.default_connection_color_byType]) {
      if (!table) continue;
      for (const [type, colour] of Object.entries(SOCKET_COLOURS)) {
        let current = colour;
        Object.defineProperty(table, type, {
          configurable: true, enumerable: true,
          get: () => current,
          set: (value) => { if (value) current = value; },
        });
      }
    }
  },

  async beforeRegisterNodeDef(nodeType, nodeData) {
    const inputs = { ...(nodeData.input?.required ?? {}), ...(nodeData.input?.optional ?? {}) };
    const makesExperts = (nodeData.output ?? []).includes(EXPERTS);
    if (makesExperts) (inputs.experts?.[0] === EXPERTS ? PASS_THROUGH : LOADERS).add(nodeData.name);
    // Hooks on the node class (not `nodeCreated`, which runs before the widgets exist).
    if (nodeData.name === "Wan22Schedule") {
      chain(nodeType, "onNodeCreated", function () {
        onWidgetChange(this, () => { showBoundaryRatio(this); schedulePreview(this); });
        showBoundaryRatio(this);
        schedulePreview(this);
      });
      chain(nodeType, "onConfigure", function () { showNewSamplerName(this); showBoundaryRatio(this); schedulePreview(this); });
      chain(nodeType, "onConnectionsChange", function () { schedulePreview(this); });
    } else if (makesExperts || inputs.unet_name) {
      // A loader's files (ours, or Load Diffusion Model behind the bridge) decide the split too.
      chain(nodeType, "onNodeCreated", function () { onWidgetChange(this, () => refreshSchedulesOf(this.graph)); });
      chain(nodeType, "onConnectionsChange", function () { refreshSchedulesOf(this.graph); });
    }
    if (!makesExperts && nodeData.name !== "Wan22Schedule" && nodeData.name !== "Wan22TwoStageSampler") return;

    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (message?.report) this.wan22Report = message.report[0];
      if (message?.text) setLines(this, "wan22Result", message.text.join("\n"));
    };

    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      const text = [this.wan22Preview, this.wan22Result].filter(Boolean).join("\n");
      if (!text || this.flags?.collapsed) return;
      const lines = text.split("\n");
      ctx.save();
      ctx.font = "12px sans-serif";
      ctx.fillStyle = "#8fd18f";
      ctx.textAlign = "left";
      lines.forEach((line, i) => {
        ctx.fillText(line, 10, this.size[1] - (lines.length - i) * LINE_HEIGHT + 10, this.size[0] - 20);
      });
      ctx.restore();
    };
  },
});
