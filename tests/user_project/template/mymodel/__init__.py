"""mymodel: a small model of one's own, with Triton kernels registered as kernel-replay ops."""
from mymodel import ops  # noqa: F401  (registers the ops)
from mymodel.model import Block

__all__ = ["Block"]
