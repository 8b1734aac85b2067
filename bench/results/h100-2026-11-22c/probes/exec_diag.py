"""Replay the real-ComfyUI GPU run's sequence through ComfyUI's own PromptExecutor, in process, then
'Unload models', and report what still holds device memory."""
import asyncio, gc, json, os, sys, tempfile, time, copy, subprocess
from pathlib import Path
import torch
ROOT = Path(__file__).resolve().parents[1]
COMFY = Path(sys.argv[1]).resolve()
SIZE = sys.argv[2]  # tiny | 0.6b
sys.path.insert(0, str(COMFY))
import comfy.cli_args
comfy.cli_args.args.cpu = not torch.cuda.is_available()
import comfy.model_management as mm
import comfy.utils
import folder_paths, execution, nodes
cuda = torch.cuda.is_available()
def mib():
    if not cuda: return 0
    gc.collect(); torch.cuda.synchronize(); return round(torch.cuda.memory_allocated() / 2**20, 1)
tmp = Path(tempfile.mkdtemp())
models = tmp / "qwen3-tts"
folder_paths.add_model_folder_path("qwen3-tts", str(models), is_default=True)
folder_paths.set_input_directory(str(tmp / "input")); (tmp / "input").mkdir()
folder_paths.set_output_directory(str(tmp / "output"))
import shutil; shutil.copy(ROOT / "assets/default_voice.wav", tmp / "input/reference.wav")
api = {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "tests/fixtures/frontend_api").glob("*.json"))}
names = sorted({n["inputs"]["model"] for wf in api.values() for n in wf.values() if n["class_type"] == "Qwen3TTSMorphLoadModel"})
procs = []
for name in names:
    folder = name.split("/")[-1]
    variant = "custom_voice" if "CustomVoice" in folder else "voice_design" if "VoiceDesign" in folder else "base"
    size = SIZE if "1.7B" not in folder or SIZE == "tiny" else "1.7b"
    procs.append(subprocess.Popen([sys.executable, "-m", "bench.random_model", "--size", size, "--variant", variant, "--out",
                                   str(models / folder), "--dtype", "bfloat16" if cuda else "float32"], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
for p in procs: p.wait()
link = tmp / "cn" / "comfyui-qwen3-tts-morph"; link.parent.mkdir(); link.symlink_to(ROOT)
asyncio.run(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
asyncio.run(nodes.load_custom_node(str(link)))
pack = next(m for k, m in sys.modules.items() if k.endswith("comfyui-qwen3-tts-morph.nodes.services") or (k.endswith(".nodes.services") and "qwen3" in k))
events = []
orig = pack._synced_after_detach
def traced(tts, dev):
    f = orig(tts, dev)
    def g(p, unpatch_all=True):
        if unpatch_all: events.append(("detach", id(tts), mib()))
        f(p, unpatch_all)
    return g
pack._synced_after_detach = traced
class S:
    client_id = None; last_node_id = None; last_prompt_id = None
    def send_sync(self, *a, **k): pass
e = execution.PromptExecutor(S(), cache_type=execution.CacheType.CLASSIC, cache_args={"lru": 0, "ram": 0})
def outputs(p): return [k for k, n in p.items() if getattr(nodes.NODE_CLASS_MAPPINGS[n["class_type"]], "OUTPUT_NODE", False)]
def cap(p, n=30):
    p = copy.deepcopy(p)
    for node in p.values():
        if "max_new_tokens" in node["inputs"]: node["inputs"]["max_new_tokens"] = n
    return p
rep = {"base": mib(), "runs": []}
i = 0
def run(name, p):
    global i; i += 1
    t = time.time(); e.execute(p, f"p{i}", {}, outputs(p))
    rep["runs"].append((name, e.success, round(time.time() - t, 2), mib()))
for name, p in api.items():
    run(name, cap(p))
# render lines 8 lines
rl = cap(api["Character lines"]); run("render lines again", rl)
# interrupt mid generation
clone = cap(api["Voice clone"], 200)
def hook(value, total, preview, prompt_id=None, node_id=None):
    mm.throw_exception_if_processing_interrupted()
    if value == 10: mm.interrupt_current_processing(True)
comfy.utils.set_progress_bar_global_hook(hook)
gen = next(k for k, n in clone.items() if n["class_type"] == "Qwen3TTSMorphGenerate")
clone[gen]["inputs"]["seed"] = 777
run("interrupted", clone)
comfy.utils.set_progress_bar_global_hook(None)
clone = cap(api["Voice clone"])
for s in range(3):
    clone[gen]["inputs"]["seed"] = 1000 + s; run(f"repeat {s}", clone)
rep["loaded"] = mib()
def live():
    out = []
    for o in gc.get_objects():
        if type(o).__name__ == "MorphTTS":
            out.append(dict(id=id(o), source=str(o.source), device=str(o.device),
                            params=sorted({str(p.device) for p in o.tts.model.parameters()}),
                            referrers=[type(r).__name__ for r in gc.get_referrers(o)][:8]))
    return out
rep["tracked"] = [dict(patcher_model=type(lm.model.model).__name__ if lm.model is not None else None,
                       tts=id(lm.model.model.talker) if lm.model is not None else None, dev=str(lm.device)) for lm in mm.current_loaded_models]
rep["live_before_unload"] = live()
mm.unload_all_models(); gc.collect(); mm.soft_empty_cache()
rep["after_unload"] = mib()
rep["events"] = events
rep["live_after_unload"] = live()
big = []
if cuda:
    for o in gc.get_objects():
        try:
            if torch.is_tensor(o) and o.is_cuda and o.numel() * o.element_size() > 2**20:
                big.append((o.numel() * o.element_size() // 2**20, tuple(o.shape), [type(r).__name__ for r in gc.get_referrers(o)][:5]))
        except Exception: pass
big.sort(reverse=True)
rep["cuda_mib_in_gc_tensors"] = sum(b[0] for b in big); rep["top"] = [str(b) for b in big[:12]]
e.reset(); gc.collect(); mm.soft_empty_cache()
rep["after_free"] = mib()
print("PROBE", json.dumps(rep))
