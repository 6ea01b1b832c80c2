// Shows what a Wan2.2 Cache-DiT node reported on its last run (the loaded experts, the split) on the node.
import { app } from "../../scripts/app.js";

const NODES_WITH_RESULTS = new Set([
  "Wan22ExpertLoader", "Wan22DiffusersExpertLoader", "Wan22Schedule", "Wan22CacheDiT", "Wan22TwoStageSampler",
]);
const LINE_HEIGHT = 16;

app.registerExtension({
  name: "wan22.cachedit.results",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES_WITH_RESULTS.has(nodeData.name)) return;

    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (!message?.text) return;
      this.wan22Result = message.text.join("\n");
      const needed = this.computeSize()[1] + this.wan22Result.split("\n").length * LINE_HEIGHT + 8;
      if (this.size[1] < needed) this.setSize([this.size[0], needed]);
      this.setDirtyCanvas(true, true);
    };

    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      if (!this.wan22Result || this.flags?.collapsed) return;
      const lines = this.wan22Result.split("\n");
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
