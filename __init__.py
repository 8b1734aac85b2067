"""Qwen3-TTS Morph for ComfyUI: fast Qwen3-TTS voice cloning.

ComfyUI imports this folder as a package and reads the two mappings below. The pack's own code
is imported relatively: ComfyUI has a top-level module named `nodes` of its own.
"""

# pytest collects this folder too (it holds __init__.py) and may import this file on its own,
# outside any package, where a relative import cannot work; ComfyUI always imports it as a package.
if __package__:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    WEB_DIRECTORY = "./nodes/web"  # the frontend extension that keeps the pack's messages on their node
    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
