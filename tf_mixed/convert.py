"""Placeholder: being written."""
def convert(model, policy=None): raise NotImplementedError
