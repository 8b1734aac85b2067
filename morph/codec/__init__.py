"""The 12 Hz codec's decode: codes [frames, 16] to 24 kHz audio.

- pieces.py: upstream's own decoder (the exact reference; mode eager) over rows in pieces of bounded size;
- layers.py: the same decoder lean and streaming: each row carries its left context, so frames decode a chunk at a
  time as the talker makes them, with the audio of one whole decode to rounding, and the streamer's calls replayed
  from CUDA graphs in the fast modes (CapturedDecode);
- stream.py: the one streamer over it, on a CUDA stream of its own beside the frame loop: rows while they are made,
  and rows already made fed whole.
"""
