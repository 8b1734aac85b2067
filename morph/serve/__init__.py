"""An OpenAI-compatible speech server on the engine core (optional: `pip install .[serve]`, `cli.py serve`); its
modules are listed in docs/architecture.md (Layers), its use in docs/serving.md."""
