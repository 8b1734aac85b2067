"""Everything that adapts or loads qwen-tts: checkpoints, loading and placement, the transformers compat
shims, and quieting third-party output."""
