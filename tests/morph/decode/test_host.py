"""morph/decode/host.py on the CPU (tests/gpu/test_continuous.py checks that a copy to the GPU does not wait)."""

import torch

from morph.decode.host import to_device


def test_values_arrive_as_the_dtype_asked_for():
    got = to_device([5, 0, 2**32 - 1], "cpu")
    assert got.dtype == torch.long and got.tolist() == [5, 0, 2**32 - 1]
    assert to_device([1, 0], torch.device("cpu"), torch.bool).tolist() == [True, False]
