"""``habana_frameworks.torch.dynamo``: ``compile_backend``."""
