"""The pack's logic, free of ComfyUI: torch, diffusers and cache-dit only.

Nothing under this package imports `comfy`, `folder_paths` or `nodes`, so it can be used and tested alone.
"""
