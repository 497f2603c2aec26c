"""Prediction heads: the causal camera head and the DPT dense head."""
from .camera import CameraCausalHead, activate_pose
from .dpt import DPTHead, dpt_position_embedding

__all__ = ["CameraCausalHead", "DPTHead", "activate_pose", "dpt_position_embedding"]
