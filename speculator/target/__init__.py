"""The frozen target: `FrozenTarget` (frozen.py), the builders the target configs name
(builders.py), `dtype: auto` (dtype_choice.py), the tests' tiny tokenizer
(tiny_tokenizer.py) and the lean decoder behind it (runtime/). Nothing here imports a
draft family."""

from .frozen import FrozenTarget

__all__ = ["FrozenTarget"]
