"""Max |error| against fp64 of bf16 GEMMs at the 0.6B layer shapes: one fused GEMM vs separate ones."""
import json, sys, torch
torch.manual_seed(0)
H, Q, KV, I = 1024, 2048, 1024, 3072
out = {"allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}
for name, parts in (("qkv", [Q, KV, KV]), ("gate_up", [I, I])):
    for m in (1, 2, 4):
        errs = {"fused": [], "separate": []}; equal = 0
        for trial in range(50):
            w = (torch.randn(sum(parts), H, device="cuda") * 0.02).bfloat16()
            x = torch.randn(m, H, device="cuda").bfloat16()
            ref = x.double() @ w.double().T
            fused = torch.nn.functional.linear(x, w)
            sep = torch.cat([torch.nn.functional.linear(x, p) for p in w.split(parts)], -1)
            errs["fused"].append((fused.double() - ref).abs().max().item())
            errs["separate"].append((sep.double() - ref).abs().max().item())
            equal += bool(torch.equal(fused, sep))
        out[f"{name}_m{m}"] = {k: {"mean_max": sum(v) / len(v), "max": max(v)} for k, v in errs.items()} | {"bit_equal_trials": equal}
json.dump(out, open(sys.argv[1], "w"), indent=1); print(json.dumps(out))
