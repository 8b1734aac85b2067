"""Exercise the pack against a REAL ComfyUI's services (not the simulated ones), in this process.

    python tests/nodes/real_comfy_check.py --comfyui /path/to/ComfyUI

Needs a ComfyUI checkout (its `comfy` package and `folder_paths`) and a Python that can import both
ComfyUI and this pack. Uses a tiny random-weight model. On a CUDA machine it also checks that
"Unload models" (comfy.model_management.unload_all_models) gives the model's VRAM back.
Prints a JSON summary; exits non-zero on the first failed check. test_real_comfy.py runs it when
COMFYUI_PATH is set.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GEN = dict(language="English", seq_groups=5, seed=1, max_new_tokens=8, do_sample=True, temperature=0.9, top_k=50,
           top_p=1.0, repetition_penalty=1.05, subtalker_do_sample=True, subtalker_temperature=0.9,
           subtalker_top_k=50, subtalker_top_p=1.0)


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", help="a tiny Base checkpoint folder (default: build one with bench.random_model)")
    args = ap.parse_args()

    import torch

    sys.path.insert(0, args.comfyui)
    import comfy.cli_args

    comfy.cli_args.args.cpu = not torch.cuda.is_available()  # what --cpu does, on a machine without CUDA
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.utils
    import folder_paths

    report = {"comfy_device": str(mm.get_torch_device()), "offload_device": str(mm.unet_offload_device())}
    if args.model:
        model_dir = Path(args.model)
    else:
        sys.path.insert(0, str(ROOT))
        from bench.random_model import build_random_model

        model_dir = build_random_model(Path(tempfile.mkdtemp()) / "tiny-base", "tiny", "base", seed=0)

    # import the pack as ComfyUI's loader does
    name = str(ROOT).replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, ROOT / "__init__.py")
    pack = importlib.util.module_from_spec(spec)
    sys.modules[name] = pack
    spec.loader.exec_module(pack)
    nodes = pack.NODE_CLASS_MAPPINGS
    check(str(Path(folder_paths.models_dir) / "qwen3-tts") in folder_paths.get_folder_paths("qwen3-tts"),
          "models/qwen3-tts is registered with folder_paths")

    def cuda_allocated():
        # cuBLAS keeps a 32 MiB workspace for every stream it ran on (CUDA-graph capture uses side
        # streams): process-wide scratch, not the model's, and ComfyUI never frees it. Left out.
        gc.collect()
        torch.cuda.synchronize()
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        return torch.cuda.memory_allocated()

    baseline = cuda_allocated() if torch.cuda.is_available() else 0

    handle = nodes["Qwen3TTSMorphLoadModel"]().load(model=str(model_dir), dtype="auto", attention="auto",
                                                    device=args.device)[0]
    patcher = handle.patcher
    check(isinstance(patcher, comfy.model_patcher.ModelPatcher), "the model is wrapped in a real ModelPatcher")
    report.update(load_device=str(handle.load_device), model_dtype=str(patcher.model_dtype()),
                  model_mb=round(patcher.model_size() / 2**20, 2))

    def loaded():
        return any(lm.model is patcher for lm in mm.current_loaded_models)

    def weight_devices():
        return sorted({p.device.type for p in patcher.model.parameters()})

    cuda = handle.load_device.type == "cuda"
    progress = []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: progress.append((value, total)))

    rate = 24000
    t = np.arange(2 * rate) / rate
    wave = (0.3 * np.sin(2 * np.pi * 150 * t) + 0.05 * np.random.RandomState(0).randn(t.size)).astype(np.float32)
    audio = {"waveform": torch.from_numpy(wave)[None, None], "sample_rate": rate}
    voice = nodes["Qwen3TTSMorphVoicePrompt"]().make(handle, audio, "", False)[0]
    check(loaded(), "Voice Prompt loaded the model through load_models_gpu")

    t0 = time.time()
    out = nodes["Qwen3TTSMorphGenerate"]().generate(model=handle, voice=voice, text="Hello from ComfyUI.", **GEN)[0]
    report["generate_s"] = round(time.time() - t0, 2)
    w = out["waveform"]
    check(w.dim() == 3 and w.shape[:2] == (1, 1) and w.dtype == torch.float32 and w.device.type == "cpu",
          f"AUDIO [1, 1, T] float32 on CPU, got {tuple(w.shape)} {w.dtype} {w.device}")
    check(progress and progress[0] == (1, 8) and progress[-1] == (8, 8), f"progress 1..8 of 8, got {progress}")
    check(loaded() and weight_devices() == [handle.load_device.type], "weights on the load device while loaded")
    report["progress_updates"] = len(progress)
    if cuda:
        torch.cuda.synchronize()
        report["cuda_allocated_loaded_mb"] = round(torch.cuda.memory_allocated() / 2**20, 2)

    mm.unload_all_models()  # what the "Unload models" button ends up calling
    check(not loaded(), "unload_all_models dropped the model from ComfyUI's loaded list")
    check(weight_devices() == [handle.offload_device.type], f"weights offloaded, got {weight_devices()}")
    check(handle.tts.device == handle.offload_device, "the engine follows its weights to the offload device")
    if cuda:
        after = cuda_allocated() - baseline
        report["cuda_allocated_after_unload_mb"] = round(after / 2**20, 3)
        check(after < 0.05 * patcher.model_size() + 2**20,
              f"VRAM given back after unload: {after} bytes above the baseline left")

    progress.clear()
    nodes["Qwen3TTSMorphGenerate"]().generate(model=handle, voice=voice, text="Loaded again.", **GEN)
    check(loaded() and weight_devices() == [handle.load_device.type], "the next run loads it again")

    # Cancel: the interrupt flag set during step 2 stops generation before step 3
    progress.clear()

    def hook(value, total, preview, node_id=None):
        progress.append((value, total))
        if value == 2:
            mm.interrupt_current_processing(True)

    comfy.utils.set_progress_bar_global_hook(hook)
    try:
        nodes["Qwen3TTSMorphGenerate"]().generate(model=handle, voice=voice, text="Cancel me.",
                                                  **{**GEN, "max_new_tokens": 50})
        raise AssertionError("cancel was ignored")
    except mm.InterruptProcessingException:
        pass
    check([v for v, _ in progress] == [1, 2], f"stopped within one step, progress {progress}")
    check(not mm.processing_interrupted(), "the interrupt flag was consumed")
    comfy.utils.set_progress_bar_global_hook(None)
    nodes["Qwen3TTSMorphGenerate"]().generate(model=handle, voice=voice, text="Clean after cancel.", **GEN)
    report["ok"] = True
    print(json.dumps(report))


if __name__ == "__main__":
    main()
