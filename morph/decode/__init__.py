"""The frame step and how it runs: the patch on a loaded qwen-tts model (the one seam to morph/qwen/), the
talker loop, the code predictor, sampling, the run modes, CUDA graphs and the lean layers."""
