"""Scratch (not committed): drive the LiveEngine like the issue's load test, with random cancels, and report."""
import json, os, random, sys, threading, time
import numpy as np, torch
sys.path.insert(0, os.getcwd())
from morph.engine import MorphTTS
from morph.live_engine import LiveEngine, Busy
from morph.lines.line import Line
from morph.settings import GenerationSettings

model, out, check = sys.argv[1], sys.argv[2], sys.argv[3] == "check"
windows = [(1, 15), (10, 15), (20, 15)]
tts = MorphTTS.load(model, device="cuda", dtype="bf16")
engine = LiveEngine(tts, width=64)
rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 0)
words = "the quick brown fox jumps over a lazy dog while seven tired sailors sing about distant harbours".split()
report = dict(ok=0, failed=0, cancelled=0, errors=[], nan=[])
lock = threading.Lock()
acc = {}
nan_audio = set()
if check:
    orig = engine._between
    state = dict(frames=0)
    def between(live):
        orig(live)
        b = engine._runner.batch
        st = b.st
        W = st.batch
        if "free" not in acc or acc["free"].shape[0] != W:
            acc["free"] = torch.zeros(W, dtype=torch.bool, device="cuda"); acc["live"] = torch.zeros(W, dtype=torch.bool, device="cuda")
        bad = ~torch.isfinite(st.past_hidden.float()).reshape(W, -1).all(-1)
        m = torch.tensor([s in b.live for s in range(W)], device="cuda")
        acc["free"] |= bad & ~m
        acc["live"] |= bad & m
        state["frames"] += 1
        if state["frames"] % 50 == 0:
            f, l = acc["free"].nonzero().flatten().tolist(), acc["live"].nonzero().flatten().tolist()
            if (f or l) and len(report["nan"]) < 30:
                report["nan"].append(dict(frame=state["frames"], pos=b.position, bucket=b.bucket, free_nan=f, live_nan=l,
                                          live=sorted(b.live)))
            acc["free"].zero_(); acc["live"].zero_()
    engine._between = between
def end(rid):
    def f(err):
        with lock:
            if err is None: report["ok"] += 1
            else:
                report["failed"] += 1
                if len(report["errors"]) < 5: report["errors"].append(repr(err)[:2000])
    return f
reqs = []
def chunk(i):
    def f(w):
        if not np.isfinite(w).all(): nan_audio.add(i)
    return f
t0 = time.time()
try:
    for rate, dur in windows:
        w0 = time.time()
        while time.time() - w0 < dur:
            time.sleep(rng.expovariate(rate))
            text = " ".join(rng.choice(words) for _ in range(rng.randint(10, 35)))
            try:
                r = engine.submit(Line(text, None, "English", speaker="ryan"),
                                  GenerationSettings(max_new_tokens=62), chunk(len(reqs)), end(0))
                reqs.append(r)
            except Busy:
                pass
            if reqs and rng.random() < 0.05:
                victim = rng.choice(reqs)
                victim.cancel(); report["cancelled"] += 1
            if not engine._thread.is_alive():
                report["errors"].append("engine thread died"); break
    deadline = time.time() + 30
    while time.time() < deadline and any(r.state in ("waiting", "running") for r in reqs):
        time.sleep(0.2)
    torch.cuda.synchronize()
    report["cuda_ok"] = True
except Exception as e:
    report["cuda_ok"] = False
    report["errors"].append("main: " + repr(e)[:2000])
report["requests"] = len(reqs)
report["nan_audio_requests"] = len(nan_audio)
report["seconds"] = round(time.time() - t0, 1)
json.dump(report, open(out, "w"), indent=1)
print(json.dumps({k: v for k, v in report.items() if k != "nan"}, indent=1)[:3000])
print("nan events:", len(report["nan"]), json.dumps(report["nan"][:3])[:3000])
os._exit(0)
