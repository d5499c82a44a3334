"""``habana_frameworks.torch.hpex.experimental``: ``transformer_engine``."""
