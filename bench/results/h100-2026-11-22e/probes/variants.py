"""Lean precision variants through bench.numerics.compare, one process: argv model frames out.json"""
import json, sys, functools, time
import torch, torch.nn.functional as F
from morph import lean
from morph.engine import MorphTTS
from bench import numerics

orig_rope_tables = lean.rope_tables

def rotate32(x, cos, sin):
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos.float() + rotated * sin.float()).to(x.dtype)

def rope_tables32(rotary_emb, length, device, dtype, multimodal):
    return orig_rope_tables(rotary_emb, length, device, torch.float32, multimodal)

def attend_pv32(q, k_cache, v_cache, bias, d):
    b, _, t, hd = q.shape
    groups = d.heads // d.kv_heads
    qg = q.reshape(b, d.kv_heads, groups * t, hd)
    scores = torch.matmul(qg.float(), k_cache.transpose(2, 3).float()) * d.scale
    scores = (scores.view(b, d.kv_heads, groups, t, -1) + bias.unsqueeze(2)).view(b, d.kv_heads, groups * t, -1)
    out = torch.matmul(torch.softmax(scores, dim=-1), v_cache.float()).to(q.dtype)
    return out.view(b, d.heads, t, hd).transpose(1, 2).reshape(b, t, d.q_size)

def make_layer_step(resid1=False, mlp32=False):
    def layer_step(x, w, k_cache, v_cache, cos, sin, write_idx, bias, d):
        b, t, H = x.shape
        h = lean.rms_norm(x, w.ln1, d.eps)
        q, k, v = F.linear(h, w.wqkv).split([d.q_size, d.kv_size, d.kv_size], dim=-1)
        q = lean.rms_norm(q.view(b, t, d.heads, d.head_dim), w.q_norm, d.eps).transpose(1, 2)
        k = lean.rms_norm(k.view(b, t, d.kv_heads, d.head_dim), w.k_norm, d.eps).transpose(1, 2)
        v = v.view(b, t, d.kv_heads, d.head_dim).transpose(1, 2)
        q, k = lean.rotate(q, cos, sin), lean.rotate(k, cos, sin)
        k_cache.index_copy_(2, write_idx, k)
        v_cache.index_copy_(2, write_idx, v)
        a = lean.attend(q, k_cache, v_cache, bias, d)
        if resid1:
            x = torch.addmm(x.reshape(b * t, H), a.reshape(b * t, -1), w.wo.t()).view(b, t, H)
        else:
            x = x + F.linear(a, w.wo)
        gate, up = F.linear(lean.rms_norm(x, w.ln2, d.eps), w.wgu).split([d.intermediate, d.intermediate], dim=-1)
        act = (F.silu(gate.float()) * up.float()).to(x.dtype) if mlp32 else F.silu(gate) * up
        if resid1:
            return torch.addmm(x.reshape(b * t, H), act.reshape(b * t, -1), w.wd.t()).view(b, t, H)
        return x + F.linear(act, w.wd)
    return layer_step

VARIANTS = {
    "v_rope32": {"rotate": rotate32},
    "v_rope32t": {"rotate": rotate32, "rope_tables": rope_tables32},
    "v_pv32": {"attend": attend_pv32},
    "v_mlp32": {"layer_step": make_layer_step(mlp32=True)},
    "v_resid1": {"layer_step": make_layer_step(resid1=True)},
    "v_all": {"rotate": rotate32, "rope_tables": rope_tables32, "attend": attend_pv32,
              "layer_step": make_layer_step(resid1=True, mlp32=True)},
}
model, frames, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tts = MorphTTS.load(model, "cuda", "fp32", "sdpa")
rep = numerics.compare(tts, torch.bfloat16, torch.float32, frames, ["upstream", "lean"], variants=VARIANTS)
rep["variants"] = list(VARIANTS)
json.dump(rep, open(out + ".json", "w"), indent=1)
open(out + ".md", "w").write(numerics.markdown(rep))
print("gate failures:", rep["gate_failures"])
