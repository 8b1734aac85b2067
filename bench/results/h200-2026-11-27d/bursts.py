"""Scratch: bursts through a live engine whose small cache makes the shared position restart while the batch is empty."""
import json, os, random, sys, time
import torch
sys.path.insert(0, os.getcwd())
from morph.engine import MorphTTS
from morph.live_engine import LiveEngine, Busy
from morph.lines.line import Line
from morph.settings import GenerationSettings

model, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
tts = MorphTTS.load(model, device="cuda", dtype="bf16")
engine = LiveEngine(tts, width=64, max_frames=64, max_prompt=192)
rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 0)
words = "the quick brown fox jumps over a lazy dog while seven tired sailors sing about distant harbours".split()
rep = dict(requests=0, done=0, failed=0, cancelled=0, bursts=0, errors=[])
reqs = []
t0 = time.time()
try:
    while time.time() - t0 < seconds and engine._thread.is_alive():
        burst = []
        for _ in range(rng.randint(20, 64)):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(4, 20)))
            try:
                burst.append(engine.submit(Line(text, None, "English", speaker="ryan"),
                                           GenerationSettings(max_new_tokens=rng.randint(4, 64)),
                                           lambda w: None, lambda e: None))
            except Busy:
                pass
            time.sleep(rng.random() * 0.01)
        for r in rng.sample(burst, len(burst) // 10):
            r.cancel()
        reqs += burst
        rep["bursts"] += 1
        d = time.time() + 20
        while time.time() < d and any(r.state in ("waiting", "running") for r in burst):
            time.sleep(0.02)
        time.sleep(rng.random() * 0.2)
    torch.cuda.synchronize()
    rep["cuda_ok"] = True
except Exception as e:
    rep["cuda_ok"] = False
    rep["errors"].append(repr(e)[:500])
rep["engine_alive"] = engine._thread.is_alive()
rep["requests"] = len(reqs)
for k in ("done", "failed", "cancelled"):
    rep[k] = sum(r.state == k for r in reqs)
rep["seconds"] = round(time.time() - t0, 1)
print(json.dumps(rep), flush=True)
json.dump(rep, open(out, "w"))
os._exit(0)
