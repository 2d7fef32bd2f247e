"""A depth-bounded suffix trie with occurrence counts: SuffixDecoding's data structure.

The trie holds every substring of length <= `depth` of the sequences written into it; the
node reached by a string s counts how often s occurs. The children of the node of a pattern
p are then exactly the tokens that followed p somewhere, each with the number of times it
did, so `count(child) / sum(counts of the children)` is the empirical probability of the
next token after p.

Growth is incremental and O(depth) per token: a `Writer` keeps the nodes of every suffix
of its sequence that ends at the last token (depths 1..depth-1); appending x steps each
of them, and the root, to its child x. A pattern longer than depth - 1 cannot have a child,
so the longest pattern worth matching is depth - 1.

Matching: "the longest suffix of the context that occurred before with a continuation" is
monotone in the suffix length (a suffix of such an occurrence is one too), so it is found
by binary search over the length, each probe one walk from the root.
"""

from __future__ import annotations


class Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, Node] = {}
        self.count = 0


class SuffixTrie:
    def __init__(self, depth: int):
        if depth < 2:
            raise ValueError(f"a suffix trie needs depth >= 2 (a pattern and its next token), got {depth}")
        self.depth = depth
        self.root = Node()
        self.size = 1  # nodes, the root included

    def writer(self) -> "Writer":
        """A cursor that appends one new sequence, token by token."""
        return Writer(self)

    def add(self, tokens: list[int]) -> None:
        """Write a whole sequence."""
        writer = self.writer()
        for token in tokens:
            writer.append(token)

    def walk(self, pattern: list[int]) -> Node | None:
        """The node of `pattern`, or None if it never occurred."""
        node = self.root
        for token in pattern:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def longest_match(self, context: list[int], max_len: int | None = None) -> tuple[int, Node]:
        """(length L, node) of the longest suffix of context, L <= max_len and <= depth - 1,
        that occurred followed by some token (the node has children). L = 0 is the root
        (any token that was ever written follows the empty pattern)."""
        limit = min(len(context), self.depth - 1, len(context) if max_len is None else max_len)
        lo, hi, best = 0, limit, self.root  # invariant: length lo is a match, hi + 1 is not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            node = self.walk(context[len(context) - mid:])
            if node is not None and node.children:
                lo, best = mid, node
            else:
                hi = mid - 1
        return lo, best


class Writer:
    def __init__(self, trie: SuffixTrie):
        self.trie = trie
        self.active: list[Node] = []  # active[i]: node of the suffix of length i + 1 ending at the last token

    def append(self, token: int) -> None:
        trie, stepped = self.trie, []
        for node in [trie.root, *self.active[: trie.depth - 1]]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
                trie.size += 1
            child.count += 1
            stepped.append(child)
        self.active = stepped


def ranked_children(node: Node) -> list[tuple[int, float]]:
    """[(token, empirical probability)], most frequent first, ties to the lower token id."""
    total = sum(child.count for child in node.children.values())
    order = sorted(node.children.items(), key=lambda item: (-item[1].count, item[0]))
    return [(token, child.count / total) for token, child in order]
