"""The parallel drafters' small shapes on the tiny target, shared by the tree and sampling
tests: one block pass per step (peagle's and dflash's positions share a distribution;
dspark's and xpress's heads read the path's tokens)."""

PARALLEL_DRAFTERS = [
    ("peagle", {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64, "block_size": 4,
                "draft_vocab_size": 64}),
    ("dflash", {"block_size": 4, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 64,
                "draft_vocab_size": 64}),
    ("dspark", {"block_size": 4, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 64,
                "markov_rank": 8, "draft_vocab_size": 64}),
    ("xpress", {"block_size": 4, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 64,
                "xpress_rank": 8, "draft_vocab_size": 64}),
]
