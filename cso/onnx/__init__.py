"""Run ONNX models with cso: ``cso.onnx.InferenceSession``, as onnxruntime's.

Needs the ``onnx`` package (``pip install "cso[onnx]"``).
"""

from .graph import ModelError
from .session import InferenceSession, NodeArg

__all__ = ["InferenceSession", "NodeArg", "ModelError"]
