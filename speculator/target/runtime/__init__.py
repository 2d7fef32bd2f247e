"""The lean decoder: a Llama-family target over a static KV cache (model.py, cache.py,
config.py) and batched generation on it (generate.py)."""
