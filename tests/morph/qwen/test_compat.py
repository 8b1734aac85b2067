"""morph.qwen.compat: qwen-tts 0.1.1 on the installed transformers (4.57.x or 5.x), end to end.

A tiny random model must generate the same greedy codes after save_pretrained/from_pretrained (5.x used to
re-randomise loaded weights and leave RoPE buffers uninitialised), and those codes must equal the ones
transformers 4.57.3 produced for the same weights. The shims' wrappers are tested on fakes in
test_compat_qwen_tts.py.
"""

import inspect
import json
import logging
import warnings

import numpy as np
import pytest
import torch

from morph.qwen import compat, compat_qwen_tts, marks
from tests.audio_compare import assert_audio_close

try:
    qwen_tts = compat.import_qwen_tts()
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"qwen_tts unavailable: {exc}", allow_module_level=True)

# Imported after the shims, as production code does.
import transformers
from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

# ------------------------------------------------------------------ the module API

FRESH_IMPORT = """
import sys, transformers.utils.generic as generic
before = generic.__dict__.get("check_model_inputs")
from morph.qwen.compat import import_qwen_tts
import_qwen_tts()
from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as tok
assert generic.__dict__.get("check_model_inputs") is before, "transformers' check_model_inputs was left rebound"
print("qwen-tts's own:", tok.check_model_inputs is before)
"""


def test_a_fresh_import_leaves_transformers_as_it_was_and_prints_nothing_alarming():
    import subprocess
    import sys
    from pathlib import Path

    run = subprocess.run([sys.executable, "-c", FRESH_IMPORT], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[3])
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout + run.stderr
    for alarming in ("[ERROR]", "flash-attn is not installed", "SoX could not be found", "sox: not found",
                     "deprecated"):
        assert alarming not in out, out
    if int(transformers.__version__.split(".")[0]) >= 5 and "qwen-tts's own: False" not in out:
        pytest.fail(f"qwen-tts should keep the wrapped decorator on 5.x: {out}")


def test_a_wrapper_left_by_another_pack_is_logged(caplog):
    import functools

    from qwen_tts.core.models import configuration_qwen3_tts as configs

    original = configs.Qwen3TTSTalkerConfig.__dict__["__init__"]
    original = getattr(original, "__wrapped__", original)  # ours, on 5.x: unwrap to qwen-tts's own

    @functools.wraps(original)
    def theirs(*args, **kwargs):
        return original(*args, **kwargs)

    with caplog.at_level(logging.WARNING, logger="morph.qwen.marks"):
        assert not marks.note_foreign_wrapper(original, "Qwen3TTSTalkerConfig.__init__")
        assert not marks.note_foreign_wrapper(transformers.PreTrainedModel._init_weights, "an inherited method")
        assert not caplog.records
        assert not marks.note_foreign_wrapper(compat_qwen_tts.accept_saved_rope_parameters(original), "x")
        assert marks.note_foreign_wrapper(theirs, "Qwen3TTSTalkerConfig.__init__")  # wraps copied the module
        assert marks.note_foreign_wrapper(lambda self: None, "Qwen3TTSTalkerConfig.__init__")
    assert len(caplog.records) == 2
    assert "Qwen3TTSTalkerConfig.__init__ was already replaced by another package" in caplog.records[0].getMessage()


def test_no_shims_on_457_and_the_core_ones_on_5x():
    applied = set(compat._applied)
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        assert applied == set()
    else:
        assert {"pad_token_id", "rope_default", "tied_weights_keys", "init_weights"} <= applied


def test_import_qwen_tts_logs_one_line(caplog, monkeypatch):
    monkeypatch.setattr(compat, "_logged", False)
    with caplog.at_level(logging.INFO, logger="morph.qwen.compat"):
        assert compat.import_qwen_tts() is qwen_tts
    lines = [r.getMessage() for r in caplog.records if r.name == "morph.qwen.compat"]
    assert len(lines) == 1 and transformers.__version__ in lines[0]


def test_import_qwen_tts_explains_a_missing_package(monkeypatch):
    real_import = compat.importlib.import_module
    real_find_spec = compat.importlib.util.find_spec

    def import_module(name, *args):
        if name == "qwen_tts":
            raise ModuleNotFoundError("No module named 'sox'", name="sox")
        return real_import(name, *args)

    monkeypatch.setattr(compat.importlib, "import_module", import_module)
    monkeypatch.setattr(compat.importlib.util, "find_spec", lambda n, *a: None if n == "sox" else real_find_spec(n, *a))
    with pytest.raises(ImportError, match=r"missing: sox\. Fix, .*: \S+ -m pip install sox \(") as raised:
        compat.import_qwen_tts()
    assert "qwen-tts==0.1.1" not in str(raised.value)  # installed: nothing to reinstall


def test_import_qwen_tts_explains_a_missing_qwen_tts(monkeypatch):
    real_find_spec = compat.importlib.util.find_spec
    monkeypatch.setattr(
        compat.importlib.util, "find_spec", lambda n, *a: None if n == "qwen_tts" else real_find_spec(n, *a)
    )
    with pytest.raises(ImportError, match=r"qwen-tts==0\.1\.1 \(with --no-deps"):
        compat.import_qwen_tts()


# ------------------------------------------------------------------ a tiny model, end to end

LANGUAGES = {"english": 2050, "german": 2053, "chinese": 2055}

# Greedy codes (first 3 frames, all 16 groups) of the model below on transformers 4.57.3, CPU, fp32;
# the same on 5.0 ... 5.24 with the shims. The smallest top-1/top-2 logit gap among these 48 choices is
# 0.016, far above float noise, so this does not flip with BLAS or thread count.
GOLDEN_FIRST_FRAMES = [
    [1630, 1457, 724, 342, 1895, 1947, 1791, 2047, 1617, 1912, 644, 351, 1958, 168, 1441, 1893],
    [124, 141, 249, 1598, 151, 186, 914, 1466, 858, 443, 1292, 274, 673, 791, 1135, 544],
    [2004, 1295, 1063, 357, 220, 1282, 268, 749, 1029, 363, 484, 1678, 1577, 379, 867, 469],
]


def _tiny_config():
    talker = dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, vocab_size=3072, text_hidden_size=32, text_vocab_size=151936, num_code_groups=16,
        rope_theta=1e6, rope_scaling={"interleaved": True, "mrope_section": [2, 3, 3], "rope_type": "default"},
        codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155,
        codec_think_bos_id=2156, codec_think_eos_id=2157, codec_language_id=LANGUAGES, spk_id={}, spk_is_dialect={},
        code_predictor_config=dict(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=2048, num_code_groups=16, rope_theta=1e6,
        ),
    )
    speaker = dict(enc_dim=64, enc_channels=[32, 32, 32, 32, 96], enc_attention_channels=16, enc_se_channels=16,
                   enc_res2net_scale=4)
    return Qwen3TTSConfig(talker_config=talker, speaker_encoder_config=speaker, tts_model_type="base",
                          tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size="0b6")


def _tiny_speech_tokenizer():
    from qwen_tts.core import Qwen3TTSTokenizerV2Model
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )

    encoder = dict(hidden_size=32, num_filters=4, num_residual_layers=1, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, intermediate_size=64, codebook_size=2048, codebook_dim=32,
                   vector_quantization_hidden_dimension=32, num_quantizers=16, num_semantic_quantizers=1,
                   upsampling_ratios=[8, 6, 5, 4], upsample_groups=32, frame_rate=12.5, sampling_rate=24000,
                   sliding_window=64, max_position_embeddings=512, use_streaming=False)
    decoder = dict(codebook_size=2048, hidden_size=32, latent_dim=32, num_attention_heads=2, num_key_value_heads=2,
                   head_dim=16, intermediate_size=64, num_hidden_layers=1, num_quantizers=16, decoder_dim=32,
                   codebook_dim=32, sliding_window=8, max_position_embeddings=512)
    model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(encoder_config=encoder, decoder_config=decoder))
    _randomize(model, seed=2)
    return model.eval()


def _randomize(model, seed):
    """Weights from our own generator, so they do not depend on how a transformers version initialises."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("embedding_sum", "embed_sum")) or p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else 0.2))
            elif name.endswith("scale"):
                p.fill_(1.0)  # layer scales: let attention matter
        for name, b in model.named_buffers():
            if name.endswith(("embed_sum", "embedding_sum")):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith(("initialized", "cluster_usage")):
                b.fill_(1)


def _generate(model, **kwargs):
    g = torch.Generator().manual_seed(123)
    text = torch.tensor([[151644, 77091, 198, 1000, 2000, 3000, 4000, 5000, 151645, 198, 151644, 77091, 198]])
    prompt = dict(ref_spk_embedding=[torch.randn(64, generator=g)], x_vector_only_mode=[True], icl_mode=[False],
                  ref_code=[None])
    torch.manual_seed(0)
    codes, _ = model.generate(input_ids=[text], languages=["english"], voice_clone_prompt=prompt, max_new_tokens=12,
                              **kwargs)
    return codes[0]


GREEDY = dict(do_sample=False, subtalker_dosample=False)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    model = Qwen3TTSForConditionalGeneration(_tiny_config())
    _randomize(model, seed=1)
    return model.eval()


@pytest.fixture(scope="module")
def saved_dir(tiny_model, tmp_path_factory):
    from qwen_tts.core.models.configuration_qwen3_tts import (
        Qwen3TTSSpeakerEncoderConfig,
    )
    from transformers import EncodecFeatureExtractor

    path = tmp_path_factory.mktemp("tiny_qwen3_tts")
    tiny_model.save_pretrained(path)
    _tiny_speech_tokenizer().save_pretrained(path / "speech_tokenizer")
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000).save_pretrained(path / "speech_tokenizer")
    (path / "generation_config.json").write_text(json.dumps({"do_sample": True}))
    # save_pretrained writes PretrainedConfig keys into speaker_encoder_config, whose __init__ takes no
    # **kwargs (an upstream bug on every version); real checkpoints hold only its own fields.
    config = json.loads((path / "config.json").read_text())
    fields = set(inspect.signature(Qwen3TTSSpeakerEncoderConfig.__init__).parameters) - {"self"}
    config["speaker_encoder_config"] = {k: v for k, v in config["speaker_encoder_config"].items() if k in fields}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_tiny_model_generates_greedy_codes_deterministically(tiny_model):
    first = _generate(tiny_model, **GREEDY)
    assert first.shape[1] == 16 and 2 <= first.shape[0] <= 11
    assert first.min() >= 0 and first.max() < 2048
    assert torch.equal(first, _generate(tiny_model, **GREEDY))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_from_pretrained_reproduces_the_codes(tiny_model, saved_dir, attn):
    loaded = Qwen3TTSForConditionalGeneration.from_pretrained(saved_dir, attn_implementation=attn).eval()
    assert loaded.talker.config._attn_implementation == attn
    assert torch.equal(_generate(loaded, **GREEDY), _generate(tiny_model, **GREEDY))
    sampled = dict(do_sample=True, subtalker_dosample=True, top_k=50, temperature=0.9)
    assert torch.equal(_generate(loaded, **sampled), _generate(tiny_model, **sampled))


def test_loaded_rope_buffers_are_the_computed_ones(saved_dir):
    loaded = Qwen3TTSForConditionalGeneration.from_pretrained(saved_dir)
    expected, _ = compat_qwen_tts.compute_default_rope_parameters(loaded.config.talker_config)
    assert torch.equal(loaded.talker.model.rotary_emb.inv_freq, expected)
    decoder_rotary = loaded.speech_tokenizer.model.decoder.pre_transformer.rotary_emb
    expected, _ = compat_qwen_tts.compute_default_rope_parameters(loaded.speech_tokenizer.model.config.decoder_config)
    assert torch.equal(decoder_rotary.inv_freq, expected)


def test_speech_tokenizer_round_trips(saved_dir):
    tokenizer = _tiny_speech_tokenizer()
    loaded = Qwen3TTSForConditionalGeneration.from_pretrained(saved_dir).speech_tokenizer
    codes = torch.randint(0, 2048, (1, 6, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = tokenizer.decode(codes).audio_values[0]
    wavs, sr = loaded.decode({"audio_codes": [codes[0]]})
    assert sr == 24000 and wavs[0].shape == (6 * 1920,)
    assert_audio_close(wavs[0], expected, rel=1e-5)

    audio = np.random.default_rng(6).standard_normal(24000).astype(np.float32) * 0.1
    with torch.no_grad():
        expected = tokenizer.encode(torch.from_numpy(audio)[None], torch.ones(1, 24000, dtype=torch.long))
    got = loaded.encode(audio, sr=24000)
    assert torch.equal(got.audio_codes[0], expected.audio_codes[0])  # the Mimi encoder loaded its weights


def _generate_batch(model, prompts, speakers, languages):
    clone = dict(ref_spk_embedding=speakers, x_vector_only_mode=[True] * len(prompts), icl_mode=[False] * len(prompts),
                 ref_code=[None] * len(prompts))
    codes, _ = model.generate(input_ids=prompts, languages=languages, voice_clone_prompt=clone, max_new_tokens=8,
                              **GREEDY)
    return [c.tolist() for c in codes]


def test_left_padded_batch_gives_each_prompt_its_own_codes(tiny_model):
    # 5.4+ stopped passing cache_position; the talker then rebuilt its RoPE positions over the whole
    # (padded) sequence each step.
    short = torch.tensor([[151644, 77091, 198, 1000, 2000, 3000, 151645, 198, 151644, 77091, 198]])
    long = torch.tensor([[151644, 77091, 198, *range(7, 16), 151645, 198, 151644, 77091, 198]])
    g = torch.Generator().manual_seed(9)
    speakers = [torch.randn(64, generator=g), torch.randn(64, generator=g)]
    batch = _generate_batch(tiny_model, [short, long], speakers, ["english", "auto"])
    assert batch[0] == _generate_batch(tiny_model, [short], speakers[:1], ["english"])[0]
    assert batch[1] == _generate_batch(tiny_model, [long], speakers[1:], ["auto"])[0]


def test_speech_tokenizer_is_saved_in_the_released_checkpoint_layout(saved_dir):
    # Qwen's checkpoints (and 4.57) name Mimi's encoder parameters like this; 5.21+ renamed the modules and
    # loads the old names only through the registered conversion (which also writes them back on save).
    from safetensors import safe_open

    with safe_open(str(saved_dir / "speech_tokenizer" / "model.safetensors"), "pt") as f:
        prefixes = {".".join(k.split(".")[:3]) for k in f.keys()}
    assert {"encoder.encoder.layers", "encoder.encoder_transformer.layers", "encoder.downsample.conv"} <= prefixes


def test_greedy_codes_equal_transformers_457(tiny_model):
    assert _generate(tiny_model, **GREEDY)[:3].tolist() == GOLDEN_FIRST_FRAMES


def test_no_note_on_the_cache_name_from_generate_or_the_forward_the_pack_calls(tiny_model, monkeypatch):
    # 5.24 renamed past_key_values to cache (ModelOutput fields, the mask functions, generate's model inputs) and
    # notes each use of the old name, the ModelOutput one once per process: qwen-tts and the pack use only the old
    # name, and their users can do nothing about it.
    from transformers.cache_utils import DynamicCache

    said = []

    def warning_once(self, msg, *args, **kwargs):
        said.append(msg % args if args else msg)

    monkeypatch.setattr(logging.Logger, "warning_once", warning_once)  # every time, not only the first
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _generate(tiny_model, **GREEDY)  # upstream's path: HF generate, twice nested
        cache = DynamicCache()
        g = torch.Generator().manual_seed(3)
        out = tiny_model.talker(inputs_embeds=torch.randn(1, 5, 64, generator=g), attention_mask=torch.ones(1, 5),
                                past_key_values=cache, use_cache=True, cache_position=torch.arange(5),
                                trailing_text_hidden=torch.randn(1, 2, 64, generator=g),
                                tts_pad_embed=torch.randn(1, 1, 64, generator=g), return_dict=True)
        assert out.past_key_values is cache and cache.get_seq_length() == 5  # as the pack's prefill reads it
    said += [str(w.message) for w in caught]
    assert [m for m in said if "past_key_values" in m or "cache_params" in m] == []
