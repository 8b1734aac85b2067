"""The 12 Hz codec's decode: codes [frames, 16] to 24 kHz audio.

- pieces.py: upstream's own decoder (the exact reference; mode eager) over rows in pieces of bounded size;
- layers.py: the same decoder written lean and streaming: rows carry their state (each causal layer's left context,
  the transformer's sliding window), so frames decode a chunk at a time as the talker makes them, with the audio
  of one whole decode to rounding;
- stream.py: the one streamer over it: rows opened, fed their frames and read back, on a CUDA stream of its own
  beside the frame loop; the continuous batch's rows while they are made, and rows already made fed whole;
- captured.py: the streamer's calls replayed from CUDA graphs, in the fast modes.
"""
