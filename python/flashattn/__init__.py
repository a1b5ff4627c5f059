"""flashattn: exact, IO-aware attention (FlashAttention) for numpy arrays, PyTorch tensors and any
DLPack array, on the CPU and on NVIDIA GPUs.

    import flashattn
    out = flashattn.attention(q, k, v, causal=True)      # q, k, v: [batch, seqlen, heads, head_dim]

PyTorch tensors get autograd and torch.compile support; flashattn.compat offers flash-attn 2.x's
functions and flashattn.sdpa PyTorch's scaled_dot_product_attention.
"""

from . import _ext
from .api import (attention, attention_backward, attention_varlen, attention_varlen_backward, backend_available,
                  sdpa)
from . import compat

__version__ = _ext.version()

__all__ = ["attention", "attention_backward", "attention_varlen", "attention_varlen_backward", "backend_available",
           "sdpa", "compat", "__version__"]
