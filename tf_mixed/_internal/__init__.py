"""Private: Keras/TF internals (one tested shim each), facts, validation, losses,
quiet imports and CLI errors. Nothing here is public; this file imports nothing,
so `import tf_mixed` stays free of TensorFlow.
"""
