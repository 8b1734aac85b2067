"""The pack's ComfyUI nodes (V1 API). Node ids are saved in workflows: never rename one."""

from . import services
from .batch import RenderLines, VoiceBank
from .generate import GenerateCustomVoice, GenerateVoiceClone, GenerateVoiceDesign
from .model import LoadModel
from .smooth import SmoothNormalize
from .voice import LoadVoice, SaveVoice, VoicePrompt

NODES = (LoadModel, VoicePrompt, SaveVoice, LoadVoice, GenerateVoiceClone, GenerateCustomVoice,
         GenerateVoiceDesign, SmoothNormalize, VoiceBank, RenderLines)

NODE_CLASS_MAPPINGS = {cls.NODE_ID: cls for cls in NODES}
NODE_DISPLAY_NAME_MAPPINGS = {cls.NODE_ID: cls.DISPLAY_NAME for cls in NODES}

services.register_model_folder()

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
