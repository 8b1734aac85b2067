"""bench/workload.py graph_bytes, on the GPU under the process's allocator (tools/gpu_check.sh runs both): what a
captured graph holds outside torch's allocated counter, which the memory checks (test_memory.py) add to its peak."""

from __future__ import annotations

import torch

from bench.workload import graph_bytes
from morph.graphs import trim_graph_memory

SCRATCH = 64 * 2**20


def test_a_captured_graphs_scratch_counts_and_goes_with_the_graph():
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.ones(SCRATCH // 4, device=device)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    trim_graph_memory()
    before, allocated = graph_bytes(device), torch.cuda.memory_allocated()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        (x * 2).sum()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = (x * 2).sum()  # x * 2 is the graph's scratch, freed inside the capture
    graph.replay()
    torch.cuda.synchronize()
    assert out.item() == 2 * x.numel()
    assert graph_bytes(device) - before >= SCRATCH  # the scratch, kept for the replays
    assert torch.cuda.memory_allocated() - allocated < SCRATCH  # which the allocated counter does not show
    del graph, out
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    trim_graph_memory()
    assert graph_bytes(device) - before < SCRATCH
