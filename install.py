"""Run by ComfyUI-Manager after `pip install -r requirements.txt`.

Installs qwen-tts without its dependency pins, so the user's transformers is kept
(qwen-tts 0.1.1 would otherwise downgrade it to 4.57.3 and pull in gradio).
"""

import subprocess
import sys

QWEN_TTS = "qwen-tts==0.1.1"

if __name__ == "__main__":
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--no-deps", QWEN_TTS])
