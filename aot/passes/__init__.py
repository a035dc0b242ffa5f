"""Graph passes: the transformation API, the registry and the built-in passes.

Importing ``aot.passes`` registers every built-in pass; ``aot.passes.registry``
looks them up by name. See ``base.py`` for the API, ``rule.py`` for the
match / check / rewrite shape of every pass that rewrites a pattern, and each
pass module for the graph before and after and the math.
"""

from . import registry
from .approximate_gelu import ApproximateGelu
from .base import PassResult, ReversibleTransformation, Transformation
from .cast_precision import CastPrecision
from .change_true_div_to_mul_by_inverse import ChangeTrueDivToMulByInverse
from .compose import compose
from .dead_code_elimination import DeadCodeElimination
from .deep_copy import DeepCopy
from .fuse_batch_norm_1d_in_linear import FuseBatchNorm1dInLinear
from .fuse_batch_norm_2d_in_conv_2d import FuseBatchNorm2dInConv2d
from .fuse_bias_in_linear import FuseBiasInLinear
from .group_query_attention import GroupQueryAttention
from .lint_and_recompile import LintAndRecompile
from .merge_linears import MergeLinears
from .prepack_linear_weights import PrepackLinearWeights
from .quantize_linear_int8 import QuantizeLinearInt8
from .quantize_linear_weights import QuantizeLinearWeights
from .registry import PassInfo, register_pass
from .remove_dropout import RemoveDropout
from .remove_identity import RemoveIdentity
from .remove_redundant_casts import RemoveRedundantCasts
from .remove_redundant_reshapes import RemoveRedundantReshapes
from .rule import Match, RewriteRule

__all__ = [
    "ApproximateGelu",
    "CastPrecision",
    "ChangeTrueDivToMulByInverse",
    "DeadCodeElimination",
    "DeepCopy",
    "FuseBatchNorm1dInLinear",
    "FuseBatchNorm2dInConv2d",
    "FuseBiasInLinear",
    "GroupQueryAttention",
    "LintAndRecompile",
    "Match",
    "MergeLinears",
    "PassInfo",
    "PassResult",
    "PrepackLinearWeights",
    "QuantizeLinearInt8",
    "QuantizeLinearWeights",
    "RemoveDropout",
    "RemoveIdentity",
    "RemoveRedundantCasts",
    "RemoveRedundantReshapes",
    "ReversibleTransformation",
    "RewriteRule",
    "Transformation",
    "compose",
    "register_pass",
    "registry",
]
