"""A small byte-level BPE tokenizer with a ChatML template, for the tiny test target.

Trained in milliseconds on a fixed built-in text, so it is identical on every machine
and needs no download.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 384

# ChatML, the template SmolLM2-Instruct uses, so the tiny target exercises the same path.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """
def add(a, b):
    return a + b

def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

The quick brown fox jumps over the lazy dog. A speculator proposes tokens and the
target verifies them in one forward pass. Write a function that returns the sum of a
list of numbers. Explain why the sky is blue. What is the capital of France?
for i in range(10):
    print(i * i)
class Stack:
    def __init__(self):
        self.items = []
    def push(self, item):
        self.items.append(item)
"""


@lru_cache(maxsize=1)
def _train() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tok


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train(),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
