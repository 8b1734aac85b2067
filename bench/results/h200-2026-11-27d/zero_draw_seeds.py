"""Scratch: seeded requests whose talker draw meets the old stream's zero Exp(1) value, through the live engine."""
import json, os, sys, time, threading
import torch
sys.path.insert(0, os.getcwd())
from morph.engine import MorphTTS
from morph.live_engine import LiveEngine
from morph.lines.line import Line
from morph.settings import GenerationSettings
from morph.prompts import make_rows, stream_keys
from morph.decode.streams import _mix, SLOTS

model, out = sys.argv[1], sys.argv[2]
tts = MorphTTS.load(model, device="cuda", dtype="bf16")
engine = LiveEngine(tts, width=64)
text = "Hello there, this is a test of the speech server, speaking one line."
line = Line(text, None, "English", speaker="ryan")
V = 3072
tok = _mix(torch.arange(V, dtype=torch.long, device="cuda") * 0x9E3779B9 + 1)
frames = torch.arange(-1, 62, device="cuda")
found = []
for seed in range(20000):
    rows = make_rows(tts, [line], GenerationSettings(seed=seed, max_new_tokens=62), "x", True, ["r"])
    key = torch.tensor(stream_keys(rows, seed), device="cuda")
    counter = (frames + 1) * SLOTS  # slot 0: the talker's draw
    base = _mix(_mix(key ^ _mix(counter)) + counter)
    bits = _mix(base.unsqueeze(-1) ^ tok)
    hit = ((bits >> 8) == (1 << 24) - 1).nonzero()
    if len(hit):
        found.append((seed, int(frames[hit[0, 0]]), int(hit[0, 1])))
    if len(found) >= 24:
        break
print("seeds with a zero at the talker's draw (seed, frame, token):", found, flush=True)
done = threading.Event(); ends = []
def end(e):
    ends.append(None if e is None else repr(e)[:300])
reqs = [engine.submit(line, GenerationSettings(seed=s, max_new_tokens=62), lambda w: None, end) for s, _, _ in found]
t0 = time.time()
while time.time() - t0 < 90 and any(r.state in ("waiting", "running") for r in reqs):
    time.sleep(0.1)
try:
    torch.cuda.synchronize(); ok = True
except Exception as e:
    ok = repr(e)[:300]
res = dict(found=found, states=[r.state for r in reqs], errors=[e for e in ends if e], cuda=ok,
           engine_alive=engine._thread.is_alive())
print(json.dumps(res)[:3000], flush=True)
json.dump(res, open(out, "w"))
os._exit(0)
