"""How much an answer repeats itself: the count of its most frequent sentence.

Small models fall into saying one sentence over and over until the token cap. Sentences end at
Western or CJK end punctuation or a line break; fragments of eight characters or fewer (list
numbers, "Yes.") are not counted.
"""

import re
from collections import Counter

SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s*|\n+")


def most_repeated(text: str) -> int:
    """How many times the most frequent sentence of ``text`` occurs (0 for no sentence)."""
    sentences = [s.strip() for s in SENTENCE_END.split(text) if len(s.strip()) > 8]
    return max(Counter(sentences).values(), default=0)
