"""Does 'Unload models' give the VRAM back when the nodes ran under inference_mode, as ComfyUI runs them?"""
import gc, importlib.util, json, sys, time, os
from pathlib import Path
import numpy as np
import torch
ROOT = Path.cwd()
sys.path.insert(0, str(ROOT / ".comfyui"))
import comfy.cli_args
comfy.cli_args.args.cpu = not torch.cuda.is_available()
import comfy.model_management as mm
import comfy.utils
sys.path.insert(0, str(ROOT))
model_dir, infer, mode = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
name = str(ROOT).replace(".", "_x_")
spec = importlib.util.spec_from_file_location(name, ROOT / "__init__.py")
pack = importlib.util.module_from_spec(spec); sys.modules[name] = pack; spec.loader.exec_module(pack)
nodes = pack.NODE_CLASS_MAPPINGS
services = sys.modules[name + ".nodes.services"]
events = []
orig = services._synced_after_detach
def traced(tts, dev):
    f = orig(tts, dev)
    def g(p, unpatch_all=True):
        events.append(("detach", unpatch_all, mib()))
        f(p, unpatch_all)
        events.append(("after_release", mib()))
    return g
services._synced_after_detach = traced
def mib():
    if not torch.cuda.is_available(): return 0
    torch.cuda.synchronize(); return round(torch.cuda.memory_allocated() / 2**20, 1)
rep = {"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "inference_mode": infer, "mode": mode, "base": mib()}
ctx = torch.inference_mode if infer else torch.no_grad
rate = 24000; t = np.arange(3 * rate) / rate
wave = (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32)
audio = {"waveform": torch.from_numpy(wave)[None, None], "sample_rate": rate}
GEN = dict(language="English", seq_groups=5, seed=1, max_new_tokens=40, do_sample=True, temperature=0.9, top_k=50,
           top_p=1.0, repetition_penalty=1.05, subtalker_do_sample=True, subtalker_temperature=0.9,
           subtalker_top_k=50, subtalker_top_p=1.0)
with ctx():
    handle = nodes["Qwen3TTSMorphLoadModel"]().load(model=model_dir, dtype="auto", attention="auto", device="auto", speed_mode=mode)[0]
    voice = nodes["Qwen3TTSMorphVoicePrompt"]().make(handle, audio, "", False)[0]
    nodes["Qwen3TTSMorphGenerate"]().generate(model=handle, voice=voice, text="Hello from ComfyUI, how are you.", **GEN)
rep["loaded"] = mib()
rep["last_run"] = {k: str(v) for k, v in (handle.tts.patch.last_run or {}).items()}
mm.unload_all_models()
gc.collect(); mm.soft_empty_cache()
rep["after_unload"] = mib()
rep["events"] = events
rep["param_devices"] = sorted({str(p.device) for p in handle.patcher.model.parameters()})
rep["reserved_after"] = round(torch.cuda.memory_reserved() / 2**20, 1)
big = []
for o in gc.get_objects():
    try:
        if torch.is_tensor(o) and o.is_cuda and o.numel() * o.element_size() > 2**20:
            refs = [type(r).__name__ for r in gc.get_referrers(o)][:6]
            big.append((o.numel() * o.element_size() // 2**20, tuple(o.shape), str(o.dtype), type(o).__name__, o.is_inference(), refs))
    except Exception as e:
        pass
big.sort(reverse=True)
rep["cuda_tensors_gt1mib"] = len(big); rep["cuda_tensor_mib"] = sum(b[0] for b in big); rep["top"] = [str(b) for b in big[:15]]
print("PROBE", json.dumps(rep))
