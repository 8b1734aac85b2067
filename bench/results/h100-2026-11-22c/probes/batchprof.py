"""Where a batch-32 k=5 decode step spends its time, and where batch 1's end-to-end peak memory comes from."""
import collections, json, sys, time
import torch
sys.path.insert(0, ".")
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from bench.speed import eos_suppressed, reference_wave, REF_TEXT
from bench.batch import script
from morph.engine import MorphTTS
from morph.batch import BatchTTS, Line
from morph.settings import GenerationSettings
model = sys.argv[1]
tts = MorphTTS.load(model, device="cuda", dtype="bf16", attention="sdpa", mode="auto")
voice = tts.make_voice(reference_wave(), 24000)
batch = BatchTTS(tts)
rep = {}
def prof(lines, frames, k):
    s = GenerationSettings(seq_groups=k, seed=0, max_new_tokens=frames + 1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        t = time.perf_counter(); batch.codes(lines, s); torch.cuda.synchronize(); wall = time.perf_counter() - t
    names, times = collections.Counter(), collections.Counter()
    for e in p.events():
        if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False): continue
        names[e.name] += 1; times[e.name] += e.time_range.elapsed_us()
    return wall, names, times
for B, k in ((32, 5), (32, 15), (1, 5)):
    lines = [Line(t, voice, "English") for t in script(B)]
    with eos_suppressed(tts, 70):
        batch.codes(lines, GenerationSettings(seq_groups=k, seed=0, max_new_tokens=9))  # warm / capture
        torch.cuda.synchronize()
        t = time.perf_counter(); batch.codes(lines, GenerationSettings(seq_groups=k, seed=0, max_new_tokens=63)); torch.cuda.synchronize()
        plain = time.perf_counter() - t
        wa, na, ta = prof(lines, 12, k)
        wb, nb, tb = prof(lines, 62, k)
    steps = 50
    d = {n: (tb[n] - ta.get(n, 0)) / steps for n in tb}
    top = sorted(d.items(), key=lambda kv: -kv[1])[:30]
    rep[f"B{B}_k{k}"] = dict(wall_62_unprofiled_s=round(plain, 4), kernel_us_per_step=round(sum(d.values()), 1),
                             kernels_per_step=round((sum(nb.values()) - sum(na.values())) / steps, 1),
                             top=[(n[:80], round(v, 1), round((nb[n] - na.get(n, 0)) / steps, 1)) for n, v in top])
# batch 32 end to end, phases
lines = [Line(t, voice, "English") for t in script(32)]
s = GenerationSettings(seq_groups=5, seed=0, max_new_tokens=63)
with eos_suppressed(tts, 62):
    batch.render(lines, s, batch_size=32); torch.cuda.synchronize()
    t0 = time.perf_counter(); codes = batch.codes(lines, s); torch.cuda.synchronize(); t1 = time.perf_counter()
    batch.decode(codes, [l.voice for l in lines]); torch.cuda.synchronize(); t2 = time.perf_counter()
    batch.render(lines, s, batch_size=32); torch.cuda.synchronize(); t3 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        batch.decode(codes, [l.voice for l in lines]); torch.cuda.synchronize()
    kt = collections.Counter()
    for e in p.events():
        if e.device_type == DeviceType.CUDA: kt[e.name] += e.time_range.elapsed_us()
rep["B32_e2e"] = dict(codes_s=round(t1 - t0, 4), codec_s=round(t2 - t1, 4), render_s=round(t3 - t2, 4),
                      codec_kernel_us=round(sum(kt.values())), codec_top=[(n[:70], round(v)) for n, v in kt.most_common(12)])
# batch 1 memory phases, 250 frames
line = [Line(script(1)[0] * 4, voice, "English")]
s = GenerationSettings(seq_groups=5, seed=0, max_new_tokens=251)
with eos_suppressed(tts, 250):
    batch.render(line, s); torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats(); codes = batch.codes(line, s); torch.cuda.synchronize()
    p_codes = torch.cuda.max_memory_allocated()
    mid = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats(); batch.decode(codes, [voice]); torch.cuda.synchronize()
    p_codec = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats(); tts.clone(line[0].text, voice, "English", s); torch.cuda.synchronize()
    p_e2e = torch.cuda.max_memory_allocated()
weights = sum(p.numel() * p.element_size() for p in tts.tts.model.parameters()) + sum(
    p.numel() * p.element_size() for p in tts.tts.model.speech_tokenizer.model.parameters())
G = 2**30
rep["B1_memory_gib"] = dict(weights=round(weights / G, 3), allocated_idle=round(base / G, 3), peak_codes=round(p_codes / G, 3),
                            after_codes=round(mid / G, 3), peak_codec=round(p_codec / G, 3), peak_clone=round(p_e2e / G, 3))
print("PROBE", json.dumps(rep))
