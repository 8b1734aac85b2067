"""The frame step and how it runs: the talker loop, code predictor, sampling, run modes, CUDA graphs, lean layers."""
