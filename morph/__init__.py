"""Fast Qwen3-TTS voice cloning (docs/architecture.md); exports load on first use, so morph.settings loads no engine."""

_EXPORTS = {"MorphTTS": "api", "GenerationSettings": "settings"}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = list(_EXPORTS)
