"""Mode "eager" with seq_groups 15 reads the code predictor's logits as upstream does (fp32, CPU): every pass's
per-group logits equal upstream's bit for bit, and an exact tie goes where upstream's argmax sends it.

Each test loads its model afresh and runs upstream first, so both read the lm_head weights where loading put them.
"""

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.random_model import build_random_model
from morph.api import MorphTTS
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling

from ..helpers import recorded_codes

SR = 24000
REF_TEXT = "This is a test of the text to speech system."
TEXT = "Good morning, how are you today? Please read this sentence out loud."
TEXTS = [TEXT, "A short one."]


@contextlib.contextmanager
def head_logits(tts: MorphTTS):
    """Every F.linear through one of the code predictor's lm_head weights (found by value, so whatever tensor a side
    reads them from counts), as (group, the logits of the pass's last position [B, V])."""
    heads = [h.weight.detach().clone() for h in tts.tts.model.talker.code_predictor.lm_head]
    seen: list[tuple[int, torch.Tensor]] = []
    linear = F.linear

    def spy(x, weight, bias=None):
        out = linear(x, weight, bias)
        if weight.shape == heads[0].shape:
            group = next((g for g, w in enumerate(heads) if torch.equal(weight, w)), None)
            if group is not None:
                seen.append((group, out[:, -1].clone()))
        return out

    F.linear = spy
    try:
        yield seen
    finally:
        F.linear = linear


def issue_clip() -> np.ndarray:
    """Issue 63's reference: 3 s of a wobbling tone with noise."""
    t = np.arange(3 * SR) / SR
    wave = (0.3 * np.sin(2 * np.pi * 150 * t + 2 * np.sin(2 * np.pi * 2 * t)) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.05 * np.random.RandomState(100).randn(t.size))
    return wave.astype(np.float32)


def settings(sampled: bool, frames: int, seed: int = 0) -> GenerationSettings:
    return GenerationSettings(seq_groups=15, do_sample=sampled, subtalker=Sampling(do_sample=sampled), seed=seed,
                              max_new_tokens=frames)


@pytest.fixture(autouse=True)
def one_thread():
    """Issue 63's tie fell with one thread; the restore keeps the rest of the session as it was."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def seed1_dir(tmp_path_factory):
    return build_random_model(tmp_path_factory.mktemp("seed1") / "tiny-base", "tiny", "base", seed=1)


def upstream_run(tts: MorphTTS, voices: list, languages: list[str], texts: list[str], s: GenerationSettings):
    """Upstream's codes (per row) and head logits for one line or one batch of rows."""
    with tts.upstream() as plain, recorded_codes(plain) as codes, head_logits(tts) as seen:
        torch.manual_seed(s.seed)
        plain.generate_voice_clone(text=texts if len(texts) > 1 else texts[0],
                                   language=languages if len(texts) > 1 else languages[0],
                                   voice_clone_prompt=[tts._prompt_item(v) for v in voices],
                                   **s.upstream_kwargs(texts[0]))
    return codes[0], seen


def pack_run(tts: MorphTTS, voices: list, languages: list[str], texts: list[str], s: GenerationSettings):
    """The pack's codes and head logits for the same rows, in one batch."""
    with head_logits(tts) as seen:
        lines = [Line(t, v, lang) for t, v, lang in zip(texts, voices, languages, strict=True)]
        codes = BatchTTS(tts).codes(lines, s)
    assert tts.patch.last_run["mode"] == "eager"
    return codes, seen


def head_addresses(tts: MorphTTS) -> list[int]:
    return [h.weight.data_ptr() for h in tts.tts.model.talker.code_predictor.lm_head]


def assert_same_logits(upstream, ours):
    (up_codes, up_seen), (codes, seen) = upstream, ours
    assert len(seen) == len(up_seen) >= 15 * 4
    for n, ((g_up, up), (g, mine)) in enumerate(zip(up_seen, seen, strict=True)):
        assert g == g_up == n % 15
        assert torch.equal(mine, up), f"frame {n // 15}, group {g + 1}: {(mine - up).abs().max().item()}"
    assert all(torch.equal(a, b) for a, b in zip(up_codes, codes, strict=True))


CASES = {
    # issue 63: greedy, ICL, language Auto, 31 frames; its group-10 logits at frame 23 hold an exact tie
    "issue63": (("tiny", "base"), "sdpa", False, 31, 0, ["Auto"], [True]),
    # the 1.7B layout: a Linear projection in front of a predictor narrower than the talker
    "projection": (("tiny-proj", "base"), "sdpa", True, 12, 7, ["English"], [True]),
    # another checkpoint, eager attention, a batch of an ICL row and an x-vector row
    "seed1-batch": ("seed1", "eager", True, 12, 3, ["English", "German"], [True, False]),
}


@pytest.mark.parametrize("case", CASES)
def test_exact_mode_head_logits_equal_upstreams_bit_for_bit(model_dirs, seed1_dir, case):
    which, attention, sampled, frames, seed, languages, icl = CASES[case]
    path = seed1_dir if which == "seed1" else model_dirs(*which)
    tts = MorphTTS.load(str(path), device="cpu", dtype="fp32", attention=attention)
    voices = [tts.make_voice(issue_clip(), SR, transcript=REF_TEXT if i else None) for i in icl]
    texts, s = TEXTS[:len(voices)], settings(sampled, frames, seed)
    addresses = head_addresses(tts)
    upstream = upstream_run(tts, voices, languages, texts, s)  # first: it reads the weights where loading put them
    assert_same_logits(upstream, pack_run(tts, voices, languages, texts, s))
    assert head_addresses(tts) == addresses  # and so does the pack: it reads those very tensors, never a copy
    if case == "projection":
        assert isinstance(tts.tts.model.talker.code_predictor.small_to_mtp_projection, torch.nn.Linear)


def test_an_exact_tie_goes_where_upstreams_argmax_sends_it(model_dirs):
    """Each group's head gets a second row equal to the row that wins frame 0; the tied logits are bit-equal, and the
    pack picks the first of them, as upstream's argmax does."""
    tts = MorphTTS.load(str(model_dirs("tiny", "base")), device="cpu", dtype="fp32", attention="sdpa")
    voice = tts.make_voice(issue_clip(), SR, transcript=REF_TEXT)
    rows = [voice], ["English"], [TEXT], settings(False, 6)
    _, seen = upstream_run(tts, *rows)
    heads = tts.tts.model.talker.code_predictor.lm_head
    vocab = heads[0].weight.shape[0]
    tied = []
    with torch.no_grad():
        for g, logits in seen[:15]:
            a = int(logits[0].argmax())
            b = a + 1 if a + 1 < vocab else a - 1
            heads[g].weight[b] = heads[g].weight[a]  # in place: the weights stay where loading put them
            tied.append((a, b))
    upstream, ours = upstream_run(tts, *rows), pack_run(tts, *rows)
    (up_codes, up_seen), (codes, _) = upstream, ours
    for g, (a, b) in enumerate(tied):
        logits = up_seen[g][1][0]
        assert logits[a] == logits[b] == logits.max()
        assert int(up_codes[0][0, g + 1]) == int(codes[0][0, g + 1]) == min(a, b)
    assert_same_logits(upstream, ours)
