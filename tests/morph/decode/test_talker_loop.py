"""TalkerLoop.rules: upstream's talker keywords read once, for the continuous batch and the reference loop alike."""

import torch

from morph.settings import Sampling

OPTIONS = dict(eos_token_id=7, suppress_tokens=[3, 5], repetition_penalty=1.05, do_sample=True, temperature=0.9,
               top_k=50, top_p=0.95, subtalker_dosample=False, subtalker_temperature=0.8, subtalker_top_k=30,
               subtalker_top_p=0.7)


def test_every_keyword_reaches_the_rules_and_the_code_predictors_sampling(tiny_tts):
    cp, rules = tiny_tts.patch.loop.rules(torch.device("cpu"), OPTIONS)
    assert cp == Sampling(False, 0.8, 30, 0.7)
    assert rules.key == (7, (3, 5), 1.05, Sampling(True, 0.9, 50, 0.95))
    assert rules.suppress_mask.nonzero().flatten().tolist() == [3, 5]


def test_rules_are_kept_per_setting(tiny_tts):
    loop, cpu = tiny_tts.patch.loop, torch.device("cpu")
    first = loop.rules(cpu, OPTIONS)[1]
    assert loop.rules(cpu, dict(OPTIONS))[1] is first  # the same settings: the same device tensors, one graph key
    for name, value in [("eos_token_id", 8), ("suppress_tokens", [3]), ("repetition_penalty", 1.0),
                        ("do_sample", False), ("temperature", 1.0), ("top_k", 0), ("top_p", 1.0)]:
        other = loop.rules(cpu, {**OPTIONS, name: value})[1]
        assert other is not first and other.key != first.key, name
