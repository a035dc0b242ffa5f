"""Torch-only modules that optimised graphs call at run time.

Each module here is self-contained (torch and the standard library only) so
that an artifact writer can copy its source into a saved, torch-only
``module.py``.
"""

from .int8_linear import Int8DynamicLinear
from .onednn_linear import OneDNNLinear
from .upcast_weights import UpcastEmbedding, UpcastLinear
from .weight_only_linear import WeightOnlyLinear

__all__ = ["Int8DynamicLinear", "OneDNNLinear", "UpcastEmbedding", "UpcastLinear", "WeightOnlyLinear"]
