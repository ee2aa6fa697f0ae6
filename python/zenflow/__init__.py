"""ZenFlow: a remote CPU optimizer for offloaded fine-tuning, served by zenflowd.

``zenflow.torch.ZenFlowOptimizer`` is the PyTorch entry point; ``zenflow.config``
reads DeepSpeed-style configuration; errors are ``zenflow.ZenFlowError``.
"""

from zenflow.errors import ZenFlowError

__all__ = ["ZenFlowError"]
