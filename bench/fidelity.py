"""Fidelity of seq_groups < 15 on real weights: speaker similarity, code agreement, optional CER.

For users with a real checkpoint (the pack's claims for k < 15 come from the technique's
authors until someone runs this). Given a folder of reference clips and a list of texts:

- speaker similarity: for every clip, text, seed and k in --seq-groups (default 15, 7, 5, 4),
  the cosine between the model's own speaker-encoder embedding of the reference clip and of
  the clip the engine speaks (MorphTTS.clone, GenerationSettings(seq_groups=k, seed=...));
- code agreement: per clip and text, upstream's codes (k = 15) are recorded, then teacher
  forced (bench/numerics.py) through upstream's layers in the loaded precision, and per
  group k+1..15 the argmax of the crossbar's logits is compared with the argmax of the
  sequential pass at k = 15 (groups 1..k are the same passes at every k);
- CER (optional): with --asr pointing at a local transformers speech-recognition model
  folder, the character error rate of each output against its text. Nothing is downloaded.

Clips: `NAME.wav` (or .flac/.ogg) with an optional `NAME.txt` transcript beside it (with
one, the voice is ICL; without, x-vector only). Texts: one per line.

    python -m bench.fidelity --model /path/to/Qwen3-TTS-12Hz-0.6B-Base --clips refs/ --texts texts.txt \\
        --json out/fidelity.json --markdown out/fidelity.md [--asr /path/to/whisper-small]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import unicodedata
from pathlib import Path

import numpy as np
import torch

from bench import numerics
from bench.common import add_model_args, emit, load_bench_model, project_commit
from morph.api import MorphTTS
from morph.settings import SAMPLE_RATE, GenerationSettings, default_max_frames

KS = (15, 7, 5, 4)
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")


def load_clips(folder: str | os.PathLike) -> list[dict]:
    """Every audio file of the folder, with the transcript beside it if there is one."""
    import soundfile as sf

    clips = []
    for path in sorted(Path(folder).iterdir()):
        if path.suffix.lower() in AUDIO_SUFFIXES:
            wave, sr = sf.read(str(path), dtype="float32")
            text = path.with_suffix(".txt")
            clips.append(dict(name=path.stem, wave=wave, sr=int(sr),
                              transcript=text.read_text(encoding="utf-8").strip() if text.exists() else None))
    if not clips:
        raise ValueError(f"fidelity: no {'/'.join(AUDIO_SUFFIXES)} clips in {folder}")
    return clips


def speaker_embedding(tts: MorphTTS, audio: np.ndarray) -> torch.Tensor:
    """The model's own speaker-encoder embedding of 24 kHz audio (what voice prompts use)."""
    return tts.tts.model.extract_speaker_embedding(np.asarray(audio, dtype=np.float32), SAMPLE_RATE).float().cpu()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def normalise(text: str) -> str:
    """Lower case, no punctuation, single spaces: what CER compares."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    return re.sub(r"\s+", " ", text).strip()


def cer(reference: str, hypothesis: str) -> float:
    """Character error rate: Levenshtein distance over the reference's length, after normalise()."""
    ref, hyp = normalise(reference), normalise(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, rc in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, hc in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (rc != hc))
    return row[-1] / max(len(ref), 1)


def local_asr(folder: str):
    """A transcriber from a local transformers ASR model folder, loaded offline."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # never download, even if the folder lacks a file
    from transformers import pipeline

    if not Path(folder).is_dir():
        raise ValueError(f"fidelity: --asr must be a local model folder; {folder} is not one")
    asr = pipeline("automatic-speech-recognition", model=folder, device="cuda" if torch.cuda.is_available() else "cpu")
    return lambda audio: asr({"raw": np.asarray(audio, dtype=np.float32), "sampling_rate": SAMPLE_RATE})["text"]


def code_agreement(tts: MorphTTS, voice, text: str, ks, frames: int, seed: int) -> dict | None:
    """Per k < 15 and group k+1..15: how often the crossbar's argmax equals the sequential pass's,
    teacher forced on upstream's codes. None when upstream ends before its first frame."""
    rec = numerics.record(tts, voice, text, frames, GenerationSettings(seed=seed), hold_eos=False)
    if rec.codes.shape[0] == 0:
        return None
    talker = tts.tts.model.talker
    with tts.upstream(), torch.inference_mode():
        logits = numerics.hf_stack(talker, rec, [k for k in ks if k < 15], talker.dtype)
    full = logits.at(15).argmax(-1)  # [15, N]
    return {str(k): {str(g + 1): float((logits.at(k)[g].argmax(-1) == full[g]).double().mean()) for g in range(k, 15)}
            for k in ks if k < 15} | {"frames": int(rec.codes.shape[0])}


def evaluate(tts: MorphTTS, clips: list[dict], texts: list[str], ks=KS, seeds=(0,), max_new_tokens: int | None = None,
             transcribe=None) -> dict:
    """Every clip x text x seed at every k: the report's rows and per-k means."""
    rows, agreement = [], []
    for clip in clips:
        voice = tts.make_voice(clip["wave"], clip["sr"], clip["transcript"])
        reference = voice.spk_embedding
        for text in texts:
            for seed in seeds:
                print(f"fidelity: {clip['name']} | {text[:40]!r} | seed {seed}", file=sys.stderr, flush=True)
                for k in ks:
                    audio = tts.clone(text, voice, settings=GenerationSettings(seq_groups=k, seed=seed,
                                                                               max_new_tokens=max_new_tokens))
                    rows.append(dict(clip=clip["name"], icl=voice.icl, text=text, seed=seed, seq_groups=k,
                                     seconds=round(audio.size / SAMPLE_RATE, 2),
                                     speaker_similarity=cosine(reference, speaker_embedding(tts, audio)),
                                     cer=None if transcribe is None else cer(text, transcribe(audio))))
                found = code_agreement(tts, voice, text, ks, max_new_tokens or default_max_frames(text), seed)
                if found is not None:
                    agreement.append(found)
    summary = {}
    for k in ks:
        mine = [r for r in rows if r["seq_groups"] == k]
        cers = [r["cer"] for r in mine if r["cer"] is not None]
        groups = {} if k == 15 else {str(g + 1): float(np.mean([a[str(k)][str(g + 1)] for a in agreement]))
                                     for g in range(k, 15) if agreement}
        summary[str(k)] = dict(speaker_similarity=float(np.mean([r["speaker_similarity"] for r in mine])),
                               cer=float(np.mean(cers)) if cers else None, code_agreement=groups)
    return dict(summary=summary, rows=rows, code_agreement=agreement, seeds=list(seeds), texts=texts,
                clips=[c["name"] for c in clips])


def markdown(report: dict) -> str:
    ks = list(report["summary"])
    lines = [f"{len(report['clips'])} clips x {len(report['texts'])} texts x {len(report['seeds'])} seeds. Speaker "
             "similarity: cosine of the model's speaker embeddings, reference against output. Code agreement: "
             "teacher forced on upstream's codes, the crossbar's argmax against the sequential pass's, groups k+1..15.",
             "", "| seq_groups | speaker similarity | CER | code agreement (mean of groups k+1..15) |",
             "|---|---|---|---|"]
    for k in ks:
        s = report["summary"][k]
        agree = s["code_agreement"]
        cer_cell = "-" if s["cer"] is None else f"{s['cer']:.3f}"
        agree_cell = "-" if not agree else f"{np.mean(list(agree.values())):.1%}"
        lines.append(f"| {k} | {s['speaker_similarity']:.4f} | {cer_cell} | {agree_cell} |")
    low = [k for k in ks if report["summary"][k]["code_agreement"]]
    if low:
        lines += ["", "| group | " + " | ".join(f"k={k}" for k in low) + " |", "|---|" + "---|" * len(low)]
        for g in range(min(int(k) for k in low) + 1, 16):
            cells = [f"{report['summary'][k]['code_agreement'][str(g)]:.1%}" if str(g) in report["summary"][k][
                "code_agreement"] else "(sequential)" for k in low]
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--clips", required=True, help="folder of reference clips (NAME.wav + optional NAME.txt)")
    p.add_argument("--texts", required=True, help="file of texts to speak, one per line")
    p.add_argument("--seq-groups", default=",".join(map(str, KS)), help="comma list of k (15 is always added)")
    p.add_argument("--seeds", default="0", help="comma list of seeds")
    p.add_argument("--max-new-tokens", type=int, help="frame cap per text (default: the engine's text-based limit)")
    p.add_argument("--asr", help="a local transformers speech-recognition model folder, for CER (never downloaded)")
    p.add_argument("--json", help="write the report here too")
    p.add_argument("--markdown", help="write the table here too")
    args = p.parse_args(argv)

    texts = [t.strip() for t in Path(args.texts).read_text(encoding="utf-8").splitlines() if t.strip()]
    ks = sorted({15, *(int(k) for k in args.seq_groups.split(","))}, reverse=True)
    tts = load_bench_model(args)
    report = evaluate(tts, load_clips(args.clips), texts, ks, [int(s) for s in args.seeds.split(",")],
                      args.max_new_tokens, local_asr(args.asr) if args.asr else None)
    report = dict(**project_commit(), model=args.model or f"random weights, {args.size} dims",
                  dtype=str(tts.tts.model.dtype).replace("torch.", ""), device=str(tts.device), asr=args.asr, **report)
    table = markdown(report)
    emit(report, args.json)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    return report


if __name__ == "__main__":
    main()
