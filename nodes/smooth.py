"""Qwen3-TTS Smooth & Normalize: low-pass and peak normalisation of any AUDIO."""

from __future__ import annotations

import numpy as np
import torch

from ..postprocess import DEFAULT_CUTOFF_HZ, DEFAULT_ORDER, DEFAULT_PEAK_DBFS, lowpass, peak_normalize
from .common import CATEGORY


class SmoothNormalize:
    NODE_ID = "Qwen3TTSMorphSmooth"
    DISPLAY_NAME = "Qwen3-TTS Smooth & Normalize"
    DESCRIPTION = (
        "Smooths speech with a Butterworth low-pass (removes the codec's faint high-frequency hiss) and scales each "
        "clip to a target peak level. Works on any AUDIO: any sample rate, mono or stereo, batches.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("AUDIO",)
    RETURN_NAMES = ("audio",)
    OUTPUT_TOOLTIPS = ("The processed audio, same shape and sample rate.",)
    FUNCTION = "process"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "audio": ("AUDIO", {"tooltip": "The audio to process."}),
            "lowpass_enabled": ("BOOLEAN", {"default": True, "tooltip": "Apply the low-pass filter."}),
            "cutoff_hz": ("FLOAT", {"default": DEFAULT_CUTOFF_HZ, "min": 20.0, "max": 96000.0, "step": 10.0,
                          "tooltip": "Low-pass cutoff in Hz. At or above half the sample rate nothing is "
                                     "filtered (24 kHz audio: 12000 Hz)."}),
            "order": ("INT", {"default": DEFAULT_ORDER, "min": 1, "max": 8, "step": 1,
                      "tooltip": "Filter order: higher = steeper roll-off."}),
            "normalize_enabled": ("BOOLEAN", {"default": True, "tooltip": "Scale each clip to the target peak."}),
            "target_dbfs": ("FLOAT", {"default": DEFAULT_PEAK_DBFS, "min": -60.0, "max": 0.0, "step": 0.1,
                            "tooltip": "Target peak level in dBFS (0 = full scale). Silent clips stay silent."}),
        }}

    def process(self, audio, lowpass_enabled, cutoff_hz, order, normalize_enabled, target_dbfs):
        who = self.DISPLAY_NAME
        if not isinstance(audio, dict) or "waveform" not in audio or "sample_rate" not in audio:
            raise ValueError(f"{who}: audio is not a ComfyUI AUDIO; connect an audio output")
        waveform, rate = audio["waveform"], int(audio["sample_rate"])
        x = waveform.detach().cpu().float().numpy() if isinstance(waveform, torch.Tensor) else np.asarray(waveform)
        try:
            if lowpass_enabled:
                x = lowpass(x, rate, cutoff_hz=float(cutoff_hz), order=int(order))
            if normalize_enabled:
                x = peak_normalize(x, target_dbfs=float(target_dbfs))
        except ValueError as e:
            raise ValueError(f"{who}: {e}") from e
        out = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        return ({**audio, "waveform": out, "sample_rate": rate},)
