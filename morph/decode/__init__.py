"""The frame step and how it runs: the decode's patch on a loaded qwen-tts model, the
talker loop, the code predictor, sampling, the run modes, CUDA graphs and the lean layers."""
