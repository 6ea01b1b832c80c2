"""Test-only nodes that patch a Wan MODEL the ways other packs do, and record what reaches them: an attention
override (transformer_options["optimized_attention_override"], as sage/flash attention nodes install) and a
block replace patch (patches_replace dit double_block i, as block-level guidance nodes install). Registered
into the in-process ComfyUI by the `probe_nodes` fixture."""

RECORDED = {"attention": [], "replace": []}


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


NODES = {"Wan22TestRecordAttention": RecordAttention, "Wan22TestReplaceBlock": ReplaceBlock}
