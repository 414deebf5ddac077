"""Placeholder: being written."""
class LossScaleOptimizer: pass
def wrap_optimizer(optimizer, **kwargs): raise NotImplementedError
