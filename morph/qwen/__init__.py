"""Everything that adapts or loads qwen-tts: checkpoints, loading, the transformers compat shims, quiet output."""
