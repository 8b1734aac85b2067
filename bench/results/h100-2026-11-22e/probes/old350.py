"""morph.lean's rms_norm and stack_step as at commit 350ac5e (bf16 residual stream, RMSNorm rounded twice)."""
import torch
from morph import lean

def rms_norm(x, weight, eps):
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)

def stack_step(x, weights, norm_w, k_caches, v_caches, cos_table, sin_table, rope_pos, write_idx, lo, d):
    cos, sin = cos_table[rope_pos].unsqueeze(1), sin_table[rope_pos].unsqueeze(1)
    slots = torch.arange(k_caches[0].shape[2], device=x.device)
    valid = (slots <= write_idx.unsqueeze(1)) & (slots >= lo.view(-1, 1, 1))
    bias = torch.zeros(valid.shape, dtype=x.dtype, device=x.device).masked_fill(~valid, torch.finfo(x.dtype).min)
    for w, kc, vc in zip(weights, k_caches, v_caches):
        x = lean.layer_step(x, w, kc, vc, cos, sin, write_idx, bias.unsqueeze(1), d)
    return lean.rms_norm(x, norm_w, d.eps)

OLD = {"rms_norm": rms_norm, "stack_step": stack_step}

if __name__ == "__main__":  # run a module with the old functions: python .probe/old350.py bench.speed ...
    import runpy, sys
    lean.rms_norm, lean.stack_step = rms_norm, stack_step
    mod = sys.argv[1]; sys.argv = [mod] + sys.argv[2:]
    runpy.run_module(mod, run_name="__main__", alter_sys=True)
