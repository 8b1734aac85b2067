"""Run a module (argv[1:]) with morph.lean.layer_step as it was before this session: one fused q/k/v GEMM
and one gate/up GEMM (commit 350ac5e)."""
import runpy, sys
import torch.nn.functional as F
from morph import lean

def layer_step(x, w, k_cache, v_cache, cos, sin, write_idx, bias, d):
    b, t, _ = x.shape
    h = lean.rms_norm(x, w.ln1, d.eps)
    q, k, v = F.linear(h, w.wqkv).split([d.q_size, d.kv_size, d.kv_size], dim=-1)
    q = lean.rms_norm(q.view(b, t, d.heads, d.head_dim), w.q_norm, d.eps).transpose(1, 2)
    k = lean.rms_norm(k.view(b, t, d.kv_heads, d.head_dim), w.k_norm, d.eps).transpose(1, 2)
    v = v.view(b, t, d.kv_heads, d.head_dim).transpose(1, 2)
    q, k = lean.rotate(q, cos, sin), lean.rotate(k, cos, sin)
    k_cache.index_copy_(2, write_idx, k)
    v_cache.index_copy_(2, write_idx, v)
    x = x + F.linear(lean.attend(q, k_cache, v_cache, bias, d), w.wo)
    gate, up = F.linear(lean.rms_norm(x, w.ln2, d.eps), w.wgu).split([d.intermediate, d.intermediate], dim=-1)
    return x + F.linear(F.silu(gate) * up, w.wd)

lean.layer_step = layer_step
mod = sys.argv[1]; sys.argv = [mod] + sys.argv[2:]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
