"""The 12 Hz codec's decode, codes [frames, 16] to 24 kHz audio: upstream's own (pieces.py, mode eager), and the same
decoder lean and causal (layers.py), streamed a chunk at a time beside the frame loop (stream.py)."""
