"""The 12 Hz codec's decode: codes [frames, 16] to 24 kHz audio.

- pieces.py: upstream's own decoder (the exact reference; mode eager) over rows in pieces of bounded size, and
  the part of a long row past upstream's first 300-frame window;
- layers.py: the same decoder written lean and streaming: rows carry their state (each causal layer's left context,
  the transformer's sliding window), so frames decode a chunk at a time as the talker makes them, with the audio
  of one whole decode to rounding;
- stream.py: a render's rows through the lean decoder, chunk by chunk on a CUDA stream of its own beside the frame
  loop, an ICL voice's reference decoded once per voice as the state its rows start from;
- live.py: when a render streams its audio, each row through the lean decoder while it is made, with a state of
  its own;
- side.py: what both do on that stream: run there, take the frame loop's tensors, copy the audio to the host.
"""
