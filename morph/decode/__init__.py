"""The frame step and how it runs: the talker loop, the code predictor, sampling, the run modes, CUDA graphs and the
lean layers."""
