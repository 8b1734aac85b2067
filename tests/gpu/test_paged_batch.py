"""The paged continuous batch on the GPU (tiny model, fp32; morph/decode/kv_store.py PagedKV, the fused mode's paged
attention kernel): in the fast modes its codes are the dense batch's through joins, growth, compaction, moves down,
rows waiting for pages and rows preempted by an overcommitted pool (the host learning of ended rows frames behind the
GPU), as on the CPU (tests/morph/test_paged_batch.py)."""

import pytest
import torch

from tests.morph.test_paged_batch import ENDS, LONG, TEXTS, preempting, render


def in_mode(cuda_tts, mode, run):
    """run() with the model in `mode`, its device state released after."""
    cuda_tts.patch.mode = mode
    try:
        return run()
    finally:
        cuda_tts.patch.mode = "auto"
        cuda_tts.release_device_state()


def assert_same_codes(paged, dense):
    for i in dense:
        assert torch.equal(paged[i].cpu(), dense[i].cpu()), i


@pytest.mark.parametrize("mode", ["graphs", "fused"])
@pytest.mark.parametrize("pages", [64, 9])
def test_paged_fast_modes_give_the_dense_codes(cuda_tts, voices, mode, pages):
    dense, (paged, run) = in_mode(cuda_tts, mode, lambda: (
        render(cuda_tts, voices["icl"], 4, None, TEXTS * 2, ENDS * 2)[0],
        render(cuda_tts, voices["icl"], 4, pages, TEXTS * 2, ENDS * 2)))
    assert run["mode"] == mode and run["peak_pages"] <= pages - 1
    assert_same_codes(paged, dense)


@pytest.mark.parametrize("mode", ["graphs", "fused"])
def test_preempted_rows_give_the_dense_codes(cuda_tts, voices, mode):
    """Rows that all run long in an overcommitted pool, at the first small pool where one is preempted: each ends
    with the dense batch's codes, the host learning of ended rows frames behind the GPU."""
    dense, (paged, run, pages) = in_mode(cuda_tts, mode, lambda: (
        render(cuda_tts, voices["xvector"], 4, None, TEXTS, LONG)[0],
        preempting(lambda n: render(cuda_tts, voices["xvector"], 4, n, TEXTS, LONG, overcommit=True))))
    assert run["mode"] == mode and run["peak_pages"] <= pages - 1
    assert_same_codes(paged, dense)
