"""What cache-dit leaves on a module, read straight from cache-dit's own attributes: how tests see that each
stage had a context of its own and that nothing of it survived the stage."""

# What cache-dit sets on a module it caches; none of it may be left after the stage.
CACHE_DIT_ATTRIBUTES = ("_original_forward", "_context_manager", "_context_names", "_is_cached",
                        "_forward_pattern", "_has_separate_cfg", "_context_kwargs", "forward")


def contexts(module) -> list[tuple[bool | None, int | None]]:
    """(separate CFG, cache-dit's step count) of each context cache-dit holds on a module, as the pack's one
    reader of cache-dit's registry sees them."""
    from wan22_cachedit.nodes import cache_dit_backend

    return [(c["separate_cfg"], c["steps"]) for c in cache_dit_backend.contexts(module)]


def leftovers(module) -> list[str]:
    """Any trace of cache-dit (or of a hook) on a module and its sub-modules: empty after a clean stage."""
    found = [f"{name or '<model>'}.{attr}" for name, sub in module.named_modules() for attr in CACHE_DIT_ATTRIBUTES
             if attr in vars(sub)]
    found += [f"{name or '<model>'}:hooks" for name, sub in module.named_modules()
              if sub._forward_hooks or sub._forward_pre_hooks]
    return found


def leftovers_of_the_cache(module) -> list[str]:
    """leftovers() on the model, its block list and each block only: where the cached loop installs anything.
    Other nodes' object patches on parts inside the blocks (blocks.0.ffn.forward, ...), which ComfyUI keeps
    applied while a model stays loaded, are not the cache's."""
    def owner(found):  # the module a leftovers() entry is on
        return found[:-len(":hooks")] if found.endswith(":hooks") else found.rsplit(".", 1)[0]
    return [found for found in leftovers(module) if owner(found).count(".") <= 1]
