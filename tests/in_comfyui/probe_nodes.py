"""Test-only nodes that patch a Wan MODEL the ways other packs do, and record what reaches them: an attention
override (transformer_options["optimized_attention_override"], as sage/flash attention nodes install) and a
block replace patch (patches_replace dit double_block i, as block-level guidance nodes install). Registered
into the in-process ComfyUI by the `probe_nodes` fixture."""

RECORDED = {"attention": [], "replace": [], "route": [], "reinstalled": []}


class RecordAttention:
    """An attention override that records (call, block index, block count) and scales the attention's result
    by 1 + 0.01 x the block index, so that a wrong index changes the output. With `record_to`, it also appends
    "pid heads tokens" of each call to that file (what another process, a parallel worker, ran)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}, "optional": {"record_to": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, record_to=""):
        def override(func, *args, **kwargs):
            import os

            options = kwargs.get("transformer_options", {})
            index = options.get("block_index")
            RECORDED["attention"].append((id(options), index, options.get("total_blocks")))
            if record_to:
                heads = kwargs.get("heads", args[3] if len(args) > 3 else None)
                with open(record_to, "a", encoding="utf-8") as f:
                    f.write(f"{os.getpid()} {heads} {args[0].shape[1]}\n")
            return func(*args, **kwargs) * (1.0 + 0.01 * (index or 0))

        clone = model.clone()
        clone.model_options["transformer_options"]["optimized_attention_override"] = override
        return (clone,)


class ReplaceBlock:
    """A replace patch on one block: the original block, its output's change halved."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "block": ("INT", {"default": 2, "min": 0, "max": 100})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, block):
        def replace(args, extra):
            RECORDED["replace"].append(args["transformer_options"].get("block_index"))
            out = extra["original_block"](args)
            return {"img": args["img"] + 0.5 * (out["img"] - args["img"])}

        clone = model.clone()
        clone.set_model_patch_replace(replace, "dit", "double_block", block)
        return (clone,)


class RouteHistory:
    """A newer ComfyUI's attention-route history contract (transformer_options["attention_backend_history_v1"]:
    provider -> policy(layout=, options=, model=) -> the route's identity or None), as its sparse-attention node
    publishes it: "switch" names a dense route above `sigma` and a sparse one below (its sigma window), "same" one
    route throughout, "none" vouches for no route, "none_then_dense" for none above `sigma`. Records (sigma,
    identity, tokens) of each question."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "mode": (["switch", "same", "none", "none_then_dense"],),
                             "sigma": ("FLOAT", {"default": 0.95, "min": 0.0, "max": 1.0, "step": 0.001})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, mode, sigma):
        def policy(*, layout, options, model):
            at = float(options["sigmas"].reshape(-1)[0])
            identity = {"switch": ("dense",) if at > sigma else ("sparse",), "same": ("dense",), "none": None,
                        "none_then_dense": None if at > sigma else ("dense",)}[mode]
            RECORDED["route"].append((round(at, 4), identity, layout.seq_len))
            return identity

        clone = model.clone()
        clone.model_options["transformer_options"]["attention_backend_history_v1"] = {"probe_attention": policy}
        return (clone,)


class ReinstallingAttention:
    """An attention override that puts itself back on top at every step, as a newer ComfyUI's sparse attention
    node does: an ON_PREPARE_STATE callback (ComfyUI calls it before each evaluation) puts it back where another
    override is on top. Records each call of the callback."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model):
        import comfy.patcher_extension

        def override(func, *args, **kwargs):
            return func(*args, **kwargs)

        def on_top(patcher, timestep, model_options):
            RECORDED["reinstalled"].append(float(timestep.reshape(-1)[0]))
            options = model_options.setdefault("transformer_options", {})
            if options.get("optimized_attention_override") is not override:
                options["optimized_attention_override"] = override

        clone = model.clone()
        clone.model_options["transformer_options"]["optimized_attention_override"] = override
        clone.add_callback_with_key(comfy.patcher_extension.CallbacksMP.ON_PREPARE_STATE, "block_sparse_attention",
                                    on_top)
        return (clone,)


class VaceHintsMode:
    """Asks the cached stages of a VACE MODEL for VACE hints kept "fresh" or "cached" (vace_hints.MODE_KEY)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "mode": (["fresh", "cached"],)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, mode):
        clone = model.clone()
        clone.model_options["transformer_options"]["wan22_vace_hints"] = mode
        return (clone,)


NODES = {"Wan22TestRecordAttention": RecordAttention, "Wan22TestReplaceBlock": ReplaceBlock,
         "Wan22TestRouteHistory": RouteHistory, "Wan22TestReinstallingAttention": ReinstallingAttention,
         "Wan22TestVaceHints": VaceHintsMode}
