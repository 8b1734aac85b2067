"""bench.speed with morph.graphs.compiled's Inductor options swapped (COMPILE_VARIANT: default | cdt | max):
which options give compile mode a speed that a second process reproduces."""
import os, runpy, sys
import torch
import morph.graphs as g

OPTIONS = {"default": {}, "cdt": {"coordinate_descent_tuning": True}, "max": None}[os.environ["COMPILE_VARIANT"]]
if OPTIONS is not None:
    def compiled(fn, exact_rng=False):
        key = (fn, exact_rng)
        if key not in g._COMPILED:
            o = dict(OPTIONS, cpp_wrapper=torch.cuda.get_allocator_backend() == "cudaMallocAsync")
            if exact_rng:
                o["fallback_random"] = True
            g._COMPILED[key] = torch.compile(fn, options=o, fullgraph=True, dynamic=False)
        return g._COMPILED[key]
    g.compiled = compiled
sys.argv = ["bench.speed"] + sys.argv[1:]
runpy.run_module("bench.speed", run_name="__main__")
