"""The suffix trie (and the n-gram index) against brute-force search on random sequences."""

import random
from collections import Counter

import pytest

from speclab.speculator.suffix_tree import SuffixTrie, ranked_children


def followers(sequences, pattern):
    """Brute force: Counter of the tokens that follow each occurrence of pattern."""
    n, out = len(pattern), Counter()
    for seq in sequences:
        for i in range(len(seq) - n):
            if seq[i:i + n] == pattern:
                out[seq[i + n]] += 1
    return out


def occurrences(sequences, pattern):
    n = len(pattern)
    return sum(seq[i:i + n] == pattern for seq in sequences for i in range(len(seq) - n + 1))


def brute_longest(sequences, context, max_len):
    """The longest suffix of context (<= max_len) that some sequence continues."""
    for length in range(min(max_len, len(context)), 0, -1):
        if followers(sequences, context[len(context) - length:]):
            return length
    return 0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("vocab, depth", [(2, 6), (3, 5), (5, 9)])
def test_longest_match_and_continuations_equal_brute_force(seed, vocab, depth):
    rng = random.Random(seed * 100 + vocab)
    sequences = [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(3)]
    trie = SuffixTrie(depth)
    for seq in sequences:
        trie.add(seq)
    for _ in range(60):
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
        max_len = rng.randint(1, depth + 2)
        length, node = trie.longest_match(context, max_len)
        assert length == brute_longest(sequences, context, min(max_len, depth - 1))
        expected = followers(sequences, context[len(context) - length:])
        assert {token: child.count for token, child in node.children.items()} == dict(expected)
        total = sum(expected.values())
        ranked = ranked_children(node) if node.children else []
        assert ranked == sorted(((t, c / total) for t, c in expected.items()), key=lambda tc: (-tc[1], tc[0]))


@pytest.mark.parametrize("seed", range(4))
def test_every_node_counts_the_occurrences_of_its_string(seed):
    rng = random.Random(seed)
    sequences = [[rng.randrange(3) for _ in range(rng.randint(5, 30))] for _ in range(2)]
    trie = SuffixTrie(4)
    for seq in sequences:
        trie.add(seq)
    seen, stack = 0, [((), trie.root)]
    while stack:
        string, node = stack.pop()
        if string:
            assert node.count == occurrences(sequences, list(string)) > 0, string
            seen += 1
        assert len(string) <= 4
        stack += [(string + (token,), child) for token, child in node.children.items()]
    distinct = {tuple(s[i:i + n]) for s in sequences for n in range(1, 5) for i in range(len(s) - n + 1)}
    assert seen == len(distinct) == trie.size - 1


def test_growing_token_by_token_equals_adding_at_once():
    rng = random.Random(7)
    seq = [rng.randrange(4) for _ in range(50)]
    whole, grown = SuffixTrie(6), SuffixTrie(6)
    whole.add(seq)
    writer = grown.writer()
    for token in seq:
        writer.append(token)

    def dump(node):
        return {t: (c.count, dump(c)) for t, c in node.children.items()}

    assert dump(whole.root) == dump(grown.root) and whole.size == grown.size


def test_an_empty_trie_matches_nothing_and_depth_is_checked():
    length, node = SuffixTrie(4).longest_match([1, 2, 3])
    assert length == 0 and not node.children
    with pytest.raises(ValueError, match="depth >= 2"):
        SuffixTrie(1)
