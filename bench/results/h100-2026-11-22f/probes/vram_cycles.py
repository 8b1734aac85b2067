"""Where the VRAM left after 'Unload models' goes, in-process with ComfyUI's model management (its default
allocator: run under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync). argv: model_dir mode|plain"""
import gc, importlib.util, json, os, subprocess, sys
from pathlib import Path
import numpy as np
import torch

def used():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split()
    return {"device_used_mib": round((total - free) / 2**20), "smi_mib": int(smi[0]) if smi else None,
            "reserved_mib": round(torch.cuda.memory_reserved() / 2**20, 1),
            "allocated_mib": round(torch.cuda.memory_allocated() / 2**20, 1)}

def live_cuda():
    out = []
    for o in gc.get_objects():
        try:
            if torch.is_tensor(o) and o.is_cuda:
                out.append((round(o.untyped_storage().nbytes() / 2**20, 2), tuple(o.shape), str(o.dtype)))
        except Exception:
            pass
    out.sort(reverse=True)
    return {"count": len(out), "mib": round(sum(x[0] for x in out), 1), "top": out[:8]}

model_dir, mode = sys.argv[1], sys.argv[2]
torch.zeros(1, device="cuda")
rep = {"mode": mode, "alloc": torch.cuda.get_allocator_backend(), "baseline": used()}
if mode == "plain":
    # no pack, no ComfyUI: the kernels a TTS run touches (bf16 GEMM, conv1d, sdpa), then everything freed
    with torch.inference_mode():
        x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16); w = torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16)
        y = torch.nn.functional.linear(x, w)
        c = torch.nn.functional.conv1d(torch.randn(1, 512, 4000, device="cuda", dtype=torch.bfloat16),
                                       torch.randn(512, 512, 7, device="cuda", dtype=torch.bfloat16), padding=3)
        q = torch.randn(1, 16, 64, 128, device="cuda", dtype=torch.bfloat16)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        del x, w, y, c, q, a
    gc.collect(); torch.cuda.empty_cache()
    rep["after_ops_freed"] = used()
    torch._C._cuda_clearCublasWorkspaces(); torch.cuda.empty_cache()
    rep["after_clear_cublas"] = used()
    print(json.dumps(rep)); sys.exit(0)

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT / ".comfyui"))
import comfy.cli_args
import comfy.model_management as mm
sys.path.insert(0, str(ROOT))
name = str(ROOT).replace(".", "_x_")
spec = importlib.util.spec_from_file_location(name, ROOT / "__init__.py")
pack = importlib.util.module_from_spec(spec); sys.modules[name] = pack; spec.loader.exec_module(pack)
nodes = pack.NODE_CLASS_MAPPINGS
rate = 24000; t = np.arange(3 * rate) / rate
audio = {"waveform": torch.from_numpy((0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32))[None, None], "sample_rate": rate}
GEN = dict(language="English", seq_groups=5, seed=1, max_new_tokens=60, do_sample=True, temperature=0.9, top_k=50,
           top_p=1.0, repetition_penalty=1.05, subtalker_do_sample=True, subtalker_temperature=0.9,
           subtalker_top_k=50, subtalker_top_p=1.0)
with torch.inference_mode():
    handle = nodes["Qwen3TTSMorphLoadModel"]().load(model=model_dir, dtype="auto", attention="auto", device="auto", speed_mode=mode)[0]
    voice = nodes["Qwen3TTSMorphVoicePrompt"]().make(handle, audio, "", False)[0]
for cycle in (1, 2, 3):
    with torch.inference_mode():
        nodes["Qwen3TTSMorphGenerate"]().generate(model=handle, voice=voice, text=f"Cycle {cycle}: hello from ComfyUI, how are you.", **{**GEN, "seed": cycle})
    rep[f"loaded_{cycle}"] = used()
    rep[f"last_run_{cycle}"] = {k: str(v) for k, v in (handle.tts.patch.loop.last_run or {}).items()} if hasattr(handle.tts.patch, "loop") else None
    mm.unload_all_models(); gc.collect(); mm.soft_empty_cache()
    rep[f"after_unload_{cycle}"] = used()
    rep[f"live_after_unload_{cycle}"] = live_cuda()
torch._C._cuda_clearCublasWorkspaces(); torch.cuda.empty_cache()
rep["after_clear_cublas"] = used()
print(json.dumps(rep))
