"""bench/batch_faster.py's parts that run without the peer or a GPU: the report saved around each phase, so that a
run stopped by its time limit says how far it got, and the transformers 4.x mask its shim hands the peer."""

import json
import types

import pytest
import torch

from bench.batch_faster import Phases, legacy_causal_mask


def test_each_phase_is_saved_as_it_begins_and_ends(tmp_path):
    path = tmp_path / "faster_batch.json"
    report = dict(results=[])
    phase = Phases(report, str(path), torch.device("cpu"))
    seen = []

    def wrap():
        seen.append(json.loads(path.read_text()))  # what a time limit here would leave
        return "model"

    assert phase("wrap", wrap) == "model"
    assert seen == [dict(results=[], phases_s={}, running="wrap", complete=False)]
    saved = json.loads(path.read_text())
    assert saved["running"] is None and list(saved["phases_s"]) == ["wrap"] and saved["complete"] is False

    with pytest.raises(RuntimeError):
        phase("warm_up", lambda: (_ for _ in ()).throw(RuntimeError("capture failed")))
    saved = json.loads(path.read_text())
    assert saved["running"] == "warm_up" and list(saved["phases_s"]) == ["wrap"] and saved["complete"] is False


def test_the_legacy_mask_lets_each_query_see_the_cache_up_to_it_but_not_left_padding():
    cache = types.SimpleNamespace(get_max_length=lambda: 6)
    embeds = torch.zeros(2, 1, 8, dtype=torch.bfloat16)
    padding = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])  # row 0 left-padded by two
    mask = legacy_causal_mask(None, embeds, padding, torch.tensor([3]), cache)
    assert mask.shape == (2, 1, 1, 6) and mask.dtype == torch.bfloat16
    open_ = mask[:, 0, 0] == 0
    assert open_.tolist() == [[False, False, True, True, False, False], [True, True, True, True, False, False]]
    assert (mask[~open_.unsqueeze(1).unsqueeze(1)] == torch.finfo(torch.bfloat16).min).all()
