"""Wan2.2 Cache-DiT nodes: `core/` holds the logic (no ComfyUI), the other modules are thin V3 glue."""
