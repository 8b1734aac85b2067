"""bench/teacher_forcing.py on the CPU, tiny random model: the forcing must feed each pass the codes
it claims to (an off-by-one would shift every stack alike and hide from bench/numerics.py's gate)."""

import torch

from bench import teacher_forcing
from morph.settings import GenerationSettings, Sampling


def test_teacher_forcing_reproduces_a_greedy_recording(tiny_tts, ref_audio):
    """Greedy without repetition penalty, the recorded codes are the argmax of the logits each
    pass produced, so forcing them back must give those argmaxes at every frame and group."""
    voice = tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    greedy = GenerationSettings(seq_groups=15, do_sample=False, repetition_penalty=1.0,
                                subtalker=Sampling(do_sample=False))
    rec = teacher_forcing.record(tiny_tts, voice, "Hello world, this is a test.", 4, greedy)
    talker = tiny_tts.tts.model.talker
    with tiny_tts.upstream(), torch.inference_mode():
        stacks = [teacher_forcing.hf_stack(talker, rec, [15], torch.float32),
                  teacher_forcing.lean_stack(talker, rec, [15], torch.float32, "lean")]
    codes = rec.codes.cpu()
    for logits in stacks:
        assert torch.equal(logits.talker[:, :2048].argmax(-1), codes[:, 0])  # EOS was held back: codes only
        assert torch.equal(logits.groups.argmax(-1), codes[:, 1:].T)
