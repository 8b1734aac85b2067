"""bench/memory_map.py's reading of torch's memory history, on made-up snapshots (the history itself is the CUDA
allocator's): blocks grouped by where the project allocated them, a trace's peak and what was live there."""

import pytest

from bench import memory_map

ROOT = "/repo"


def frames(*where):
    return [{"filename": f, "line": line, "name": name} for f, line, name in where]


POOL = frames(("/repo/morph/decode/talker_state.py", 53, "__init__"), ("/repo/morph/decode/slots.py", 83, "__init__"))
PREFILL = frames(("/usr/lib/torch/functional.py", 9, "linear"), ("/repo/morph/decode/prefill.py", 51, "lean_prefill"))
WORKSPACE = frames(("/usr/lib/torch/cuda.py", 3, "matmul"))


def test_a_site_is_the_innermost_frames_in_the_project():
    assert memory_map.site(POOL, ROOT) == "morph/decode/talker_state.py:53 __init__"
    assert memory_map.site(POOL, ROOT, 2) == "morph/decode/talker_state.py:53 __init__ < morph/decode/slots.py:83 __init__"
    assert memory_map.site(PREFILL, ROOT) == "morph/decode/prefill.py:51 lean_prefill"
    assert memory_map.site(WORKSPACE, ROOT) == "outside: cuda.py:3"
    assert memory_map.site(frames(("/repository/x.py", 1, "f")), ROOT).startswith("outside")  # not a prefix match


def test_held_counts_the_live_blocks_by_site():
    segments = [{"blocks": [{"state": "active_allocated", "size": 100, "frames": POOL},
                            {"state": "inactive", "size": 999, "frames": POOL},
                            {"state": "active_allocated", "size": 30, "frames": WORKSPACE}]},
                {"blocks": [{"state": "active_allocated", "size": 50, "frames": POOL}]}]
    assert memory_map.held(segments, ROOT) == {"morph/decode/talker_state.py:53 __init__": 150,
                                               "outside: cuda.py:3": 30}


def test_the_peak_is_the_most_held_at_once_and_names_what_was_live_then():
    def alloc(addr, size, where):
        return {"action": "alloc", "addr": addr, "size": size, "frames": where}

    trace = [alloc(1, 10, PREFILL), alloc(2, 20, POOL),
             {"action": "free_requested", "addr": 1, "size": 10},  # still held until its free completes
             alloc(3, 15, WORKSPACE),  # 45 held
             {"action": "free_completed", "addr": 1, "size": 10},
             alloc(4, 5, PREFILL),  # 40
             {"action": "free_completed", "addr": 4, "size": 5},
             {"action": "free_completed", "addr": 99, "size": 7}]  # a block from before the trace began
    top, live = memory_map.peak(trace, ROOT)
    assert top == 45
    assert live == {"morph/decode/talker_state.py:53 __init__": 20, "outside: cuda.py:3": 15,
                    "morph/decode/prefill.py:51 lean_prefill": 10}


def test_it_says_where_it_runs(monkeypatch):
    monkeypatch.setattr(memory_map.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="NVIDIA GPU"):
        memory_map.main(["--size", "tiny"])
    monkeypatch.setattr(memory_map.torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    with pytest.raises(SystemExit, match="PYTORCH_CUDA_ALLOC_CONF unset"):
        memory_map.main(["--size", "tiny"])
