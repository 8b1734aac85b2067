"""Stand-ins for the ComfyUI modules the pack's services seam imports, recording what the pack does.

`install()` puts folder_paths, comfy, comfy.utils, comfy.model_management and comfy.model_patcher into
sys.modules; `uninstall()` removes them. Their behaviour follows ComfyUI 0.8.0 where the pack relies
on it: ProgressBar.update_absolute, throw_exception_if_processing_interrupted (clears the flag and
raises InterruptProcessingException), ModelPatcher(model, load_device, offload_device) whose
detach(unpatch_all=True) moves the module to the offload device and then runs ON_DETACH callbacks,
load_models_gpu([...]) moving each patcher's module to its load device, unload_all_models,
PromptServer.instance.send_sync(event, data, sid) and comfy_execution.utils.get_executing_context().
"""

from __future__ import annotations

import os
import sys
import types

import torch

MODULES = ("folder_paths", "comfy", "comfy.utils", "comfy.model_management", "comfy.model_patcher", "server",
           "comfy_execution", "comfy_execution.utils")


class Recorder:
    def __init__(self, models_dir: str):
        self.models_dir = models_dir
        self.folders: dict[str, list[str]] = {}
        self.progress: list[tuple[int, int]] = []  # (value, total) per update_absolute
        self.bars: list = []
        self.interrupt_checks = 0
        self.interrupt_at: int | None = None  # raise on this (1-based) check
        self.loads: list[dict] = []  # one per load_models_gpu call
        self.texts: list[tuple[str, str]] = []  # (node id, text) per messages event the pack sent
        self.node_id = "7"  # the node get_executing_context() reports as running
        self.loaded: list = []  # patchers currently loaded
        self.patchers: list = []
        self.device = torch.device("cpu")
        self.offload = torch.device("cpu")


def install(models_dir: str) -> Recorder:
    rec = Recorder(models_dir)

    fp = types.ModuleType("folder_paths")
    fp.models_dir = models_dir

    def add_model_folder_path(name, path, is_default=False):
        paths = rec.folders.setdefault(name, [])
        if path not in paths:
            paths.insert(0, path) if is_default else paths.append(path)

    def get_folder_paths(name):
        return rec.folders[name][:]  # KeyError when unregistered, like ComfyUI's

    fp.add_model_folder_path, fp.get_folder_paths = add_model_folder_path, get_folder_paths

    utils = types.ModuleType("comfy.utils")

    class ProgressBar:
        def __init__(self, total, node_id=None):
            self.total, self.current = total, 0
            rec.bars.append(self)

        def update_absolute(self, value, total=None, preview=None):
            if total is not None:
                self.total = total
            self.current = min(value, self.total)
            rec.progress.append((self.current, self.total))

    utils.ProgressBar = ProgressBar

    mm = types.ModuleType("comfy.model_management")

    class InterruptProcessingException(BaseException):  # as in ComfyUI 0.33 (0.8.0's is an Exception)
        pass

    def throw_exception_if_processing_interrupted():
        rec.interrupt_checks += 1
        if rec.interrupt_at is not None and rec.interrupt_checks >= rec.interrupt_at:
            rec.interrupt_at = None  # ComfyUI clears the flag as it raises
            raise InterruptProcessingException()

    def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None,
                        force_full_load=False):
        rec.loads.append({"models": list(models), "force_full_load": force_full_load,
                          "memory_required": memory_required})
        for m in models:
            m.model.to(m.load_device)
            m.model.device = m.load_device
            if m not in rec.loaded:
                rec.loaded.append(m)

    def unload_all_models():
        while rec.loaded:
            rec.loaded.pop().detach(unpatch_all=True)

    mm.InterruptProcessingException = InterruptProcessingException
    mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
    mm.load_models_gpu = load_models_gpu
    mm.unload_all_models = unload_all_models
    mm.get_torch_device = lambda: rec.device
    mm.unet_offload_device = lambda: rec.offload
    mm.soft_empty_cache = lambda force=False: None

    mp = types.ModuleType("comfy.model_patcher")

    class CallbacksMP:
        ON_DETACH = "on_detach_after"

    class ModelPatcher:
        def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
            self.model, self.load_device, self.offload_device = model, load_device, offload_device
            self.callbacks: dict[str, list] = {}
            if not hasattr(model, "device"):
                model.device = offload_device
            rec.patchers.append(self)

        def add_callback(self, call_type, callback):
            self.callbacks.setdefault(call_type, []).append(callback)

        def model_size(self):
            return sum(t.nbytes for t in self.model.state_dict().values())

        def detach(self, unpatch_all=True):
            if unpatch_all:
                self.model.to(self.offload_device)
                self.model.device = self.offload_device
            for cb in self.callbacks.get(CallbacksMP.ON_DETACH, []):
                cb(self, unpatch_all)
            return self.model

    mp.ModelPatcher, mp.CallbacksMP = ModelPatcher, CallbacksMP

    server = types.ModuleType("server")

    class PromptServer:
        instance = None

        client_id = "the client that queued the prompt"

        def send_sync(self, event, data, sid=None):
            assert event == "qwen3tts-morph.messages" and sid == self.client_id, (event, sid)
            rec.texts.append((str(data["node"]), data["text"]))

    PromptServer.instance = PromptServer()
    server.PromptServer = PromptServer

    execution = types.ModuleType("comfy_execution")
    execution_utils = types.ModuleType("comfy_execution.utils")
    execution_utils.get_executing_context = lambda: types.SimpleNamespace(prompt_id="p", node_id=rec.node_id,
                                                                          list_index=None)
    execution.utils = execution_utils

    comfy = types.ModuleType("comfy")
    comfy.utils, comfy.model_management, comfy.model_patcher = utils, mm, mp
    modules = (fp, comfy, utils, mm, mp, server, execution, execution_utils)
    for name, module in zip(MODULES, modules, strict=True):
        sys.modules[name] = module
    rec.modules = dict(zip(MODULES, modules, strict=True))
    return rec


def uninstall() -> None:
    for name in MODULES:
        sys.modules.pop(name, None)


def comfy_loaded() -> bool:
    return any(name in sys.modules for name in MODULES)


def models_dir_env(path) -> dict:
    return {"QWEN3TTS_MODELS_DIR": os.fspath(path)}
