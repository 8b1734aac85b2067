"""Where a Qwen3-TTS checkpoint comes from: a local folder, the HF cache, or a download (torch-free, for the CLI)."""

from __future__ import annotations

import difflib
import logging
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
HUB_MODELS = (
    "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
    "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
    "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
)
VARIANT_NAMES = {"base": "Base (voice clone)", "custom_voice": "CustomVoice", "voice_design": "VoiceDesign"}
# The languages of the released 12 Hz models (the engine checks a choice against the loaded model too).
LANGUAGES = ("Auto", "Chinese", "English", "French", "German", "Italian", "Japanese", "Korean", "Portuguese",
             "Russian", "Spanish")
# What qwen-tts 0.1.1 reads of a 12 Hz checkpoint; the text tokenizer may also come as one tokenizer.json
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json", "vocab.json",
         "merges.txt", "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
         "speech_tokenizer/preprocessor_config.json")
FILE_LIST = ", ".join(FILES)


def missing_files(folder: Path) -> list[str]:
    """The files of FILES that `folder` lacks (sharded *.safetensors weights count as model.safetensors)."""
    def present(name: str) -> bool:
        if name.endswith("model.safetensors"):
            return any((folder / name).parent.glob("*.safetensors"))
        tokenizer_json = name in ("vocab.json", "merges.txt") and (folder / "tokenizer.json").is_file()
        return tokenizer_json or (folder / name).is_file()

    return [name for name in FILES if not present(name)]


def is_hub_id(source: str) -> bool:
    """`owner/name`, unless `owner` is a local folder."""
    return (source.count("/") == 1 and not source.startswith((".", "/", "~"))
            and not Path(source.split("/")[0]).is_dir())


def fetch_command(repo_id: str, target: Path | str) -> str:
    return f"hf download {repo_id} --local-dir {target}"


def _checked(folder: Path, source: str) -> Path:
    missing = missing_files(folder)
    if missing:
        raise FileNotFoundError(
            f"the model folder {folder} is missing {', '.join(missing)}. A checkpoint folder holds {FILE_LIST}"
            + (f"; fetch it again with: {fetch_command(source, folder)}" if is_hub_id(source) else ""))
    return folder


def _from_hf_cache(repo_id: str) -> Path | None:
    """The model's folder in the Hugging Face cache, when a complete copy is already there."""
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id=repo_id, local_files_only=True))
    except Exception:  # not cached (huggingface_hub raises its own error types for that)
        return None
    return folder if not missing_files(folder) else None


def _close_name(source: str, search_dirs: list[Path]) -> str | None:
    """The known hub id, or folder in `search_dirs`, that comes closest to `source`, if any comes close."""
    names = list(HUB_MODELS) + [m.split("/")[1] for m in HUB_MODELS]
    names += [f.name for d in search_dirs if Path(d).is_dir() for f in Path(d).iterdir() if f.is_dir()]
    close = difflib.get_close_matches(source, names, n=1, cutoff=0.6)
    return close[0] if close else None


def check_source(source: str, search_dirs: list[Path] = ()) -> Path | None:
    """The checked local folder `source` names (a path, or in one of `search_dirs`), or None for a hub id; anything
    else is refused with the name it comes close to. Needs no network."""
    source = str(source).strip()
    name = source.rstrip("/").split("/")[-1]
    candidates = [Path(source).expanduser()]
    candidates += [Path(d) / source for d in search_dirs] + [Path(d) / name for d in search_dirs]
    for folder in candidates:
        if folder.is_dir():
            return _checked(folder.resolve(), source)
    if not is_hub_id(source):
        where = ", ".join(str(Path(d).resolve()) for d in search_dirs)
        close = _close_name(source, search_dirs)
        raise FileNotFoundError(
            f"no model folder {source!r}" + (f" (looked in {where})" if where else "")
            + (f": did you mean {close}? Or give" if close else "; give")
            + f" the path of a checkpoint folder (holding {FILE_LIST}), or a hub id such as {DEFAULT_MODEL}")
    return None


def locate_checkpoint(source: str, search_dirs: list[Path] = (), download_dir: Path | None = None) -> Path:
    """A complete checkpoint folder for `source`: check_source's, the HF cache's, else a download to `download_dir`."""
    source = str(source).strip()
    local = check_source(source, search_dirs)
    if local is not None:
        return local
    name = source.rstrip("/").split("/")[-1]
    cached = _from_hf_cache(source)
    if cached is not None:
        log.info("Qwen3-TTS: using %s from the Hugging Face cache (%s)", source, cached)
        return cached
    target = (Path(download_dir) / name).resolve() if download_dir is not None else None
    try:
        from huggingface_hub import snapshot_download

        log.info("Downloading %s into %s", source, target or "the Hugging Face cache")
        folder = Path(snapshot_download(repo_id=source, local_dir=None if target is None else str(target)))
    except Exception as e:
        close = None if source in HUB_MODELS else _close_name(source, [])
        hint = f"; did you mean {close}?" if close else ""
        place = (f"put the checkpoint's files into {target}" if target is not None
                 else "put the checkpoint's files into a folder and give that folder's path as the model")
        fetch = fetch_command(source, target if target is not None else name)
        # a typo's fix first: the offline steps after it run to hundreds of characters
        raise FileNotFoundError(
            f"could not download {source}{hint} ({type(e).__name__}: {e}). Offline, {place}: "
            f"{FILE_LIST}. To get them, run on a machine with network access: {fetch} (the hf command comes with "
            "huggingface_hub), then copy that folder here") from e
    return _checked(folder, source)
