"""The seam between the nodes and ComfyUI: the ONLY module of the pack that imports ComfyUI.

Every ComfyUI module is imported lazily, inside the function that needs it, and each
service has a fallback for when ComfyUI is absent (tests, scripts):

  folders   `folder_paths` folder "qwen3-tts" (models/qwen3-tts, plus any extra_model_paths.yaml
            entries); voices live in a `voices` subfolder of each.
            Fallback: $QWEN3TTS_MODELS_DIR, else the pack's models/qwen3-tts.
            Output folder: folder_paths.get_output_directory(). Fallback: $QWEN3TTS_OUTPUT_DIR, else the
            pack's output/.
  progress  comfy.utils.ProgressBar(total).update_absolute(step).        Fallback: nothing.
  cancel    comfy.model_management.throw_exception_if_processing_interrupted();
            its InterruptProcessingException propagates untouched.       Fallback: nothing.
  devices   comfy.model_management.get_torch_device / unet_offload_device. Fallback: the engine's own choice.
  memory    `manage`: a comfy.model_patcher.ModelPatcher around the model's weights, loaded with
            comfy.model_management.load_models_gpu before every use, so "Unload models" frees it
            (nodes/managed.py, which is handed these two modules).
            Fallback: the model stays where it was loaded.

  messages  server.PromptServer.instance.send_sync(MESSAGES_EVENT, {node, text}) for the running node
            (comfy_execution.utils.get_executing_context): every warning the pack logs while a node
            runs, and every status record (INFO with extra={"status": True}: "preparing the fused
            decoder, about 10 s ..."), is shown on that node too (`messages_on_node`), by the pack's
            frontend extension (nodes/web/messages.js), which keeps it after the job.
                                                                         Fallback: the log only.

The engine never imports ComfyUI: progress and cancel reach it as one `on_step(step, total)`
callback (see `step_callback`), and its warnings through the `logging` module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

import torch

from .managed import ManagedModel

log = logging.getLogger(__name__)

MODEL_FOLDER = "qwen3-tts"  # the folder_paths name; models/qwen3-tts by default
VOICES_SUBFOLDER = "voices"  # <models folder>/voices/<name>.safetensors
ENV_MODELS_DIR = "QWEN3TTS_MODELS_DIR"
ENV_OUTPUT_DIR = "QWEN3TTS_OUTPUT_DIR"
VOICE_SUFFIX = ".safetensors"
PACK_DIR = Path(__file__).resolve().parents[1]  # without ComfyUI, folders resolve against the pack's own


# -- ComfyUI modules, or None -----------------------------------------------------------
def _import(name: str):
    """A ComfyUI module, or None when ComfyUI is not running this process."""
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        return None


def folder_paths():
    return _import("folder_paths")


def model_management():
    return _import("comfy.model_management")


# -- folders ------------------------------------------------------------------------------
def register_model_folder() -> None:
    """Register models/qwen3-tts with ComfyUI (idempotent), so extra_model_paths.yaml can add more."""
    fp = folder_paths()
    if fp is None:
        return
    default = os.path.join(fp.models_dir, MODEL_FOLDER)
    if default not in _registered(fp):
        fp.add_model_folder_path(MODEL_FOLDER, default)


def _registered(fp) -> list[str]:
    try:
        return list(fp.get_folder_paths(MODEL_FOLDER))
    except KeyError:  # not registered yet
        return []


def model_dirs() -> list[Path]:
    """Every folder searched for models, the download/save folder first."""
    fp = folder_paths()
    if fp is None:
        return [Path(os.environ.get(ENV_MODELS_DIR) or PACK_DIR / "models" / MODEL_FOLDER).resolve()]
    register_model_folder()
    return [Path(p) for p in _registered(fp)]


def download_dir() -> Path:
    """Where hub models are downloaded to: the first registered models folder."""
    return model_dirs()[0]


def voices_dirs() -> list[Path]:
    return [d / VOICES_SUBFOLDER for d in model_dirs()]


def voices_save_dir() -> Path:
    return voices_dirs()[0]


def list_local_models() -> list[str]:
    """Subfolders (one or two levels deep, e.g. `Qwen/Qwen3-TTS-...`) that hold a config.json."""
    found = []
    for root in model_dirs():
        if not root.is_dir():
            continue
        for config in sorted(list(root.glob("*/config.json")) + list(root.glob("*/*/config.json"))):
            name = config.parent.relative_to(root).as_posix()
            top = name.split("/")[0]
            if "/" in name and (root / top / "config.json").is_file():
                continue  # a checkpoint's own subfolder, e.g. speech_tokenizer/
            if top != VOICES_SUBFOLDER and name not in found:
                found.append(name)
    return found


def list_voice_files() -> list[str]:
    """File names of the saved voices (*.safetensors) in every voices folder; empty when there are none."""
    names = []
    for folder in voices_dirs():
        if folder.is_dir():
            names += [p.name for p in sorted(folder.glob(f"*{VOICE_SUFFIX}")) if p.is_file() and p.name not in names]
    return sorted(names, key=str.lower)


def find_voice_file(name: str) -> Path | None:
    """The voice file called `name` (a plain file name, nothing else), or None."""
    if not name or Path(name).name != name or name in (".", ".."):
        return None
    for folder in voices_dirs():
        if (folder / name).is_file():
            return folder / name
    return None


def output_dir() -> Path:
    """ComfyUI's output folder (where Render Lines writes its line files)."""
    fp = folder_paths()
    if fp is not None and callable(getattr(fp, "get_output_directory", None)):
        return Path(fp.get_output_directory())
    return Path(os.environ.get(ENV_OUTPUT_DIR) or PACK_DIR / "output").resolve()


# -- devices ------------------------------------------------------------------------------
def choose_devices(device: str) -> tuple[str | None, str | None]:
    """(load device, offload device) for the Load model node's device choice.

    With ComfyUI, "auto" is ComfyUI's own device (so --cpu, --gpu-only... are honoured) and the model
    rests on ComfyUI's offload device between runs; an explicit device offloads to the CPU. A device
    is named with its index ("cuda:0"), as ComfyUI names it: its memory manager compares devices
    with ==, and torch.device("cuda") != torch.device("cuda:0"), so "Unload models" would miss it.
    Without ComfyUI: (None, None), and the engine decides.
    """
    mm = model_management()
    if mm is None:
        return None, None
    comfy_device = torch.device(mm.get_torch_device())
    if device == "auto":
        return str(comfy_device), str(mm.unet_offload_device())
    if comfy_device.type == device:
        return str(comfy_device), "cpu"
    if device == "cuda" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}", "cpu"
    return device, "cpu"


# -- progress and cancel --------------------------------------------------------------------
def check_interrupt() -> None:
    """Raise ComfyUI's InterruptProcessingException if the user pressed Cancel."""
    mm = model_management()
    if mm is not None:
        mm.throw_exception_if_processing_interrupted()


class StepReporter:
    """The engine's `on_step(step, total)`: advance ComfyUI's progress bar and honour Cancel."""

    def __init__(self):
        utils = _import("comfy.utils")
        self._bar_type = None if utils is None else utils.ProgressBar
        self._bar = None
        self.total = 0
        self.steps = 0

    def __call__(self, step: int, total: int) -> None:
        check_interrupt()  # before each frame, so a cancel lands within one step
        self.steps, self.total = step, total
        if self._bar_type is not None:
            if self._bar is None:
                self._bar = self._bar_type(total)
            self._bar.update_absolute(step, total)


def step_callback() -> StepReporter:
    return StepReporter()


# -- messages on the node -------------------------------------------------------------------------
PACK_LOGGER = __name__.rsplit(".nodes.", 1)[0]  # the pack's root logger: the engine's and the nodes' records


def _running_node() -> tuple[object, str] | None:
    """ComfyUI's server and the id of the node that is running, or None outside a ComfyUI run."""
    server, utils = _import("server"), _import("comfy_execution.utils")
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    context = utils.get_executing_context() if utils is not None else None
    return None if instance is None or context is None else (instance, context.node_id)


MESSAGES_EVENT = "qwen3tts-morph.messages"  # nodes/web/messages.js listens for it
CLEAN_RUN = "No warnings in this run."


def show_text(text: str) -> bool:
    """Show `text` on the node that is running (in place of what it showed); False when there is no ComfyUI
    frontend to show it."""
    running = _running_node()
    if running is None:
        return False
    instance, node = running
    instance.send_sync(MESSAGES_EVENT, {"node": node, "text": text}, getattr(instance, "client_id", None))
    return True


_warned: set[str] = set()  # nodes whose last run left messages on them


class _NodeMessages(logging.Handler):
    """Collects the warnings and status lines this thread logs and shows them, all so far, on the running node,
    with the latest progress line (a record with `progress`) below them, replaced by each new one."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.thread = threading.get_ident()
        self.lines: list[str] = []
        self.progress: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread:
            return  # another thread's record (the server's), not this node's
        if record.levelno >= logging.WARNING:
            self.lines.append(f"Warning: {record.getMessage()}")
        elif getattr(record, "status", False):
            self.lines.append(record.getMessage())
        elif getattr(record, "progress", False):
            self.progress = record.getMessage()
        else:
            return
        show_text("\n".join(self.lines + [self.progress] * (self.progress is not None)))


@contextlib.contextmanager
def messages_on_node():
    """Within this block, every warning the pack logs (transcript swaps, a trimmed clip, a halved batch) and
    every status line (a decoder being prepared) is shown on the running node as well as in the log: what
    the user must act on, or is waiting for, is seen where they look, and stays after the job. A clean run
    after one that showed messages replaces them with a line saying so."""
    handler = _NodeMessages()
    logger = logging.getLogger(PACK_LOGGER)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    running = _running_node()
    if running is None:  # no ComfyUI run: nothing was shown, nothing to replace
        return
    if handler.lines or handler.progress is not None:
        _warned.add(running[1])
    elif running[1] in _warned:
        _warned.discard(running[1])
        show_text(CLEAN_RUN)


# -- memory management ----------------------------------------------------------------------
def manage(tts, offload_device: str | None = None) -> ManagedModel:
    """`tts` under ComfyUI's memory manager (nodes/managed.py), when ComfyUI runs this process: loaded on its config's
    device (choose_devices' load device), resting on `offload_device` between runs."""
    return ManagedModel(tts, offload_device, _import("comfy.model_patcher"), model_management())
