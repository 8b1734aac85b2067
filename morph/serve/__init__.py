"""An OpenAI-compatible speech server on the engine (optional: `pip install .[serve]`; docs/serving.md)."""
