// Wan2.2 Cache-DiT on the canvas:
// - socket colours for the pack's types;
// - the split each schedule node will run, shown live as anything in the graph changes: the frontend's own
//   graphToPrompt (subgraphs flattened, widget values resolved) goes to the server, which reads the experts
//   behind each schedule node out of it as the nodes do and counts the split with the node's own function;
// - what each node reported after a run (the split, the cache savings, the CFG passes really used);
// - workflows saved before the boundary became a dynamic input load with their values in place, and old
//   sampler names (served by the server) show as the ComfyUI samplers they run.
// Everything is shown in a DOM widget, which the classic canvas and the Vue-nodes mode both display, in the
// frontend's theme colours, and always inserted as text.
import { app } from "../../../scripts/app.js";
import { api } from "../../../scripts/api.js";

const PACK_NODE = /^Wan22/;
const SCHEDULE = "Wan22Schedule";
const STATUS_WIDGET = "wan22_status";
const SOCKET_COLOURS = { WAN22_EXPERTS: "#b06ad9", WAN22_SCHEDULE: "#3fb6a8" };
const REFRESH_DELAY_MS = 150;

// served by GET /wan22/canvas; server_note: what the server's operator says of it (the demo server: which
// workflows it can run), shown when the page opens and after a failed run
// added_inputs: per node type, the widget values a workflow saved before an input was added runs with
const canvasInfo = { old_samplers: {}, split_nodes: [SCHEDULE], server_note: null, added_inputs: {} };
const scheduleDefaults = {}; // input name -> default, from the server's node definition
// Counters the browser tests wait on (never a fixed sleep): refreshes asked for, replies handled. Exposed only
// on a page the tests opened (they set window.wan22Testing before any script runs), never in a user's page.
const progress = { requested: 0, handled: 0 };
if (window.wan22Testing === true) window.wan22Canvas = progress;

// --- the status text, a DOM widget on each of the pack's nodes ---

function statusElement(node) {
  return node.widgets?.find((w) => w.name === STATUS_WIDGET)?.element ?? null;
}

const LINE_HEIGHT = 16;
const CHAR_WIDTH = 6.6; // of the 12px status font, to count wrapped lines

// The height the status text needs at the node's width (the classic canvas gives a DOM widget the height it
// asks for; the Vue-nodes mode lays the element out itself).
function statusHeight(node, element) {
  const text = element.textContent;
  if (!text) return 0;
  const perLine = Math.max(8, Math.floor((node.size[0] - 24) / CHAR_WIDTH));
  const lines = text.split("\n").reduce((n, line) => n + Math.max(1, Math.ceil(line.length / perLine)), 0);
  return lines * LINE_HEIGHT + 6;
}

function addStatusWidget(node) {
  if (statusElement(node)) return;
  const element = document.createElement("div");
  element.className = "wan22-status";
  Object.assign(element.style, {
    color: "var(--descrip-text, #999)", fontSize: "12px", lineHeight: `${LINE_HEIGHT}px`, whiteSpace: "pre-wrap",
    overflowWrap: "anywhere", padding: "2px 6px", pointerEvents: "none", boxSizing: "border-box",
  });
  const height = () => statusHeight(node, element);
  const widget = node.addDOMWidget(STATUS_WIDGET, STATUS_WIDGET, element, {
    serialize: false, getMinHeight: height, getMaxHeight: height,
  });
  widget.serialize = false; // not part of widgets_values, nor of the API prompt
}

function setStatus(node, key, text) {
  node.wan22Lines = { ...node.wan22Lines, [key]: text };
  const element = statusElement(node);
  if (!element) return;
  const shown = [node.wan22Lines.split, node.wan22Lines.result, node.wan22Lines.used].filter(Boolean).join("\n");
  if (element.textContent === shown) return;
  element.textContent = shown; // text, never HTML: it can carry values the user typed
  node.setSize([node.size[0], Math.max(node.size[1], node.computeSize()[1])]);
  node.setDirtyCanvas?.(true, true);
}

// --- nodes by the ids graphToPrompt and the server give them ("12", or "128:12" inside a subgraph) ---

function executionIds() {
  const ids = new Map();
  const walk = (graph, prefix, depth) => {
    for (const node of graph?.nodes ?? []) {
      const id = `${prefix}${node.id}`;
      if (!ids.has(node)) ids.set(node, id);
      if (depth < 16 && node.isSubgraphNode?.()) walk(node.subgraph, `${id}:`, depth + 1);
    }
  };
  walk(app.rootGraph ?? app.graph, "", 0);
  return ids;
}

function nodeByExecutionId(id) {
  for (const [node, nodeId] of executionIds()) if (nodeId === String(id)) return node;
  return null;
}

// --- the live split ---

function splitText(answer) {
  if (!answer) return "split: no answer";
  if (answer.error) return `split: ${answer.error}`;
  const source = answer.boundary_source.replaceAll("_", " ");
  const lead = answer.lead == null ? "" : `${answer.lead} lead (of ${answer.lead_steps}) / `;
  const split = `will run: ${lead}${answer.high} high / ${answer.low} low`;
  const handOff = answer.lead == null ? "" :
    `\nmain from step ${answer.start_step}; hand-off ${answer.hand_off_exact ? "exact" : "by a last lead step of its own"}`;
  if (answer.boundary_ratio == null) return `${split} (${source})${handOff}`;
  return `${split} (boundary ${answer.boundary_ratio}, ${source}` +
    (answer.boundary_known ? ")" : ", text-to-video assumed)") + handOff;
}

let refreshTimer = null;
let refreshTicket = 0;

function scheduleRefresh() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(refreshSplits, REFRESH_DELAY_MS);
}

async function refreshSplits() {
  const schedules = [...executionIds()].filter(([node]) => canvasInfo.split_nodes.includes(node.type));
  if (!schedules.length) return;
  const ticket = ++refreshTicket; // a reply still on its way is stale once a newer refresh starts
  progress.requested++;
  let answers = {};
  try {
    const prompt = (await app.graphToPrompt()).output;
    const response = await api.fetchApi("/wan22/split", {
      method: "POST", body: JSON.stringify({ prompt, nodes: schedules.map(([, id]) => id) }),
    });
    const reply = await response.json();
    // A refused request (400) still carries each node's split or refusal once the body was well formed;
    // a node it has no answer for shows the request's own refusal.
    const fallback = { error: reply.error ?? `the server answered ${response.status}` };
    answers = Object.fromEntries(schedules.map(([, id]) => [id, reply.splits?.[id] ?? fallback]));
  } catch (error) {
    answers = Object.fromEntries(schedules.map(([, id]) => [id, { error: String(error) }]));
  }
  progress.handled++;
  if (ticket !== refreshTicket) return;
  for (const [node, id] of schedules) {
    node.wan22Split = answers[id]?.error ? null : answers[id];
    setStatus(node, "split", splitText(answers[id]));
  }
}

// Any change of a widget or a link anywhere (a loader behind a LoRA node, a subgraph's promoted widget) can
// change the split: every node tells, and the frontend's own change tracker covers what users do by hand.
function watch(node) {
  for (const method of ["onWidgetChanged", "onConnectionsChange"]) {
    const original = node[method];
    node[method] = function () {
      const result = original?.apply(this, arguments);
      scheduleRefresh();
      return result;
    };
  }
}

// --- workflows saved by earlier versions ---

// 0.1.0 saved the schedule's widgets as [sampler, steps, flow_shift, boundary, boundary_ratio] and 0.2.0 added
// the scheduler: the ratio whatever the mode. Since the boundary became a dynamic input, the ratio follows it
// only when it is custom. So a non-custom boundary followed by a number is an old layout, rewritten before
// the frontend reads it (it hands a node only as many saved values as it has widgets); old sampler names
// become the ComfyUI samplers they run.
function migrateScheduleValues(values) {
  if (!Array.isArray(values) || values.length < 5) return values;
  const migrated = [...values];
  migrated[0] = canvasInfo.old_samplers[migrated[0]] ?? migrated[0];
  if (typeof migrated[4] === "number" && migrated.length <= 6) {
    const scheduler = migrated.length === 6 ? migrated[5] : scheduleDefaults.scheduler;
    migrated.splice(4, migrated.length - 4, ...(migrated[3] === "custom" ? [migrated[4]] : []), scheduler);
  }
  return migrated;
}

// Newer frontends hand a node no more saved values than it has widgets before its dynamic inputs expand, which
// drops the value after a custom boundary: the node takes them back from what the workflow saved.
function restoreSavedValues(node, info) {
  const widgets = node.widgets.filter((w) => w.serialize !== false);
  const saved = info?.wan22_saved_values;
  const named = info?.widgets_values_named;
  widgets.forEach((widget, i) => {
    const value = Array.isArray(saved) && saved.length === widgets.length ? saved[i]
      : named && typeof named === "object" && widget.name in named ? named[widget.name] : undefined;
    if (value !== undefined && widget.value !== value) widget.value = value;
  });
}

// A node saved before inputs were added has fewer values than widgets: the new widgets would take their
// defaults for new workflows; the saved workflow keeps what it ran with (the server's added_inputs say it, from
// the oldest saved length on: a workflow saved between two additions lacks only the later ones).
function withAddedInputs(node) {
  const added = canvasInfo.added_inputs[node?.type];
  const values = node?.widgets_values;
  if (!added || !Array.isArray(values)) return;
  const missing = added.saved_length + added.values.length - values.length;
  if (values.length < added.saved_length || missing <= 0) return;
  node.widgets_values = [...values, ...added.values.slice(added.values.length - missing)];
}

function migrateSavedWorkflow(workflow) {
  const graphs = [workflow, ...(workflow?.definitions?.subgraphs ?? [])];
  for (const node of graphs.flatMap((graph) => graph?.nodes ?? [])) {
    withAddedInputs(node);
    if (node?.type !== SCHEDULE) continue;
    node.widgets_values = migrateScheduleValues(node.widgets_values);
    if (Array.isArray(node.widgets_values)) node.wan22_saved_values = [...node.widgets_values];
  }
}

// --- the server's note ---

function showServerNote() {
  const note = canvasInfo.server_note;
  if (typeof note !== "string" || !note) return;
  const toast = app.extensionManager?.toast;
  if (typeof toast?.add === "function") {
    toast.add({ severity: "warn", summary: "Wan2.2 Cache-DiT", detail: note, life: 20000 });
  } else {
    console.warn(`wan22: ${note}`);
  }
}

// --- after a run ---

function onExecuted({ detail }) {
  const node = nodeByExecutionId(detail?.display_node ?? detail?.node);
  const output = detail?.output ?? {};
  if (!node || !PACK_NODE.test(node.type ?? "")) return;
  if (output.report) node.wan22Report = output.report[0];
  if (output.text) setStatus(node, "result", output.text.join("\n"));
  for (const used of output.cache_used ?? []) {
    const cacheNode = nodeByExecutionId(used.node);
    if (cacheNode) setStatus(cacheNode, "used", used.text);
  }
}

// The Cache-DiT MODEL node runs before its samplers: what each sample call did comes while they run.
function onCacheUsed({ detail }) {
  const node = nodeByExecutionId(detail?.node);
  if (node && PACK_NODE.test(node.type ?? "")) setStatus(node, "used", String(detail.text ?? ""));
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
    api.addEventListener("executed", onExecuted);
    api.addEventListener("wan22.cache_used", onCacheUsed);
    api.addEventListener("graphChanged", scheduleRefresh);
    try {
      Object.assign(canvasInfo, await (await api.fetchApi("/wan22/canvas")).json());
    } catch (error) {
      console.warn("wan22: canvas info unavailable", error);
    }
    if (canvasInfo.server_note) {
      showServerNote();
      api.addEventListener("execution_error", showServerNote);
    }
    scheduleRefresh();
  },

  nodeCreated(node) {
    watch(node);
  },

  beforeConfigureGraph(workflow) {
    migrateSavedWorkflow(workflow);
  },

  afterConfigureGraph() {
    scheduleRefresh();
  },

  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!PACK_NODE.test(nodeData.name)) return;
    // Hooks on the node class, not in `nodeCreated`, which runs before the widgets exist.
    chain(nodeType, "onNodeCreated", function () { addStatusWidget(this); });
    if (nodeData.name !== SCHEDULE) return;
    for (const [name, spec] of Object.entries({ ...nodeData.input?.required, ...nodeData.input?.optional })) {
      if (spec?.[1]?.default !== undefined) scheduleDefaults[name] = spec[1].default;
    }
    chain(nodeType, "onConfigure", function (info) {
      restoreSavedValues(this, info);
      scheduleRefresh();
    });
  },
});
