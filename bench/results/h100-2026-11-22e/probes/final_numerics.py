"""bench.numerics.compare, every stack, plus the lean of 350ac5e and the norm-only change as variants. argv: model frames out"""
import json, sys
import torch
sys.path.insert(0, ".probe")
from old350 import OLD
from bench import numerics
from bench.common import project_commit
from morph.engine import MorphTTS
model, frames, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tts = MorphTTS.load(model, "cuda", "fp32", "sdpa")
stacks = sys.argv[4].split(",") if len(sys.argv) > 4 else list(numerics.STACKS)
rep = numerics.compare(tts, torch.bfloat16, torch.float32, frames, stacks,
                       variants={"lean-350ac5e": OLD} if "OLDVAR" in __import__("os").environ else {})
rep = dict(**project_commit(), device=torch.cuda.get_device_name(0), torch=torch.__version__, **rep)
json.dump(rep, open(out + ".json", "w"), indent=1)
open(out + ".md", "w").write(numerics.markdown(rep))
print("gate failures:", rep["gate_failures"])
