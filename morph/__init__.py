"""Fast Qwen3-TTS voice cloning: `from morph import MorphTTS, GenerationSettings`, looked up on first use so that
importing a light module such as morph.settings does not load the engine (docs/architecture.md maps the rest)."""

_EXPORTS = {"MorphTTS": "api", "GenerationSettings": "settings"}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = list(_EXPORTS)
