"""The built-in corpus: generated English-like text whose masked words need word order and relative distance.

No download, no file: `generate_documents(n, seed)` is deterministic and of any size. Words are drawn from a
Zipfian vocabulary of pronounceable filler words (frequency of the r-th word proportional to 1/r^1.1, as in natural
language), and every sentence follows one of five rules. A model that sees only the bag of words can learn the
unigram distribution and which words co-occur, but not where they go; the rules make position matter:

1. **Agreement at a fixed distance.** A subject word `S_j` is followed, exactly three words later, by its own
   marker `M_j` (50 pairs): `S_j f f M_j f ...`. Predicting a masked marker needs the word three positions back.
2. **Nested brackets.** Opener words and their closers (4 pairs) form a well-nested sequence (depth <= 4) with
   fillers in between: a masked closer is the partner of the innermost opener still open, which only order gives.
3. **Copied spans.** `f1 .. fk echo f1 .. fk` (k = 3..8): the second half repeats the first at offset k + 1.
4. **Counting.** Number words in ascending order from a random start (`tri tet pen hex`): a masked number is the
   successor of its left neighbour.
5. **Plain filler.** Zipfian fillers (the background a model must not over-fit positions to).

Documents are 3-12 sentences, each ending with `.`; `write_corpus` writes them as text (a blank line between documents).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

from roformer.files import atomic_write

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
NUMBERS = ["un", "duo", "tri", "tet", "pen", "hex", "sep", "okt", "non", "dek", "elf", "dod"]
BRACKETS = [("kra", "akr"), ("tro", "ort"), ("ple", "elp"), ("smo", "oms")]
AGREEMENT_DISTANCE = 3
NUM_PAIRS = 50
NUM_FILLERS = 2000
ZIPF_EXPONENT = 1.1


class BuiltinCorpus:
    """The vocabulary and sentence rules for one seed (see the module docstring)."""

    def __init__(self, seed: int = 0, num_fillers: int = NUM_FILLERS) -> None:
        vocab_rng = random.Random(1_000_003 * seed + 17)
        reserved = set(NUMBERS) | {w for pair in BRACKETS for w in pair} | {"echo"}
        words: list[str] = []
        seen: set[str] = set(reserved)
        while len(words) < num_fillers + 2 * NUM_PAIRS:
            word = "".join(vocab_rng.choice(_SYLLABLES) for _ in range(vocab_rng.choice((2, 2, 3))))
            if word not in seen:
                seen.add(word)
                words.append(word)
        self.fillers = words[:num_fillers]
        self.subjects = words[num_fillers : num_fillers + NUM_PAIRS]
        self.markers = words[num_fillers + NUM_PAIRS :]
        self.cum_weights = list(itertools.accumulate(1.0 / (rank + 1) ** ZIPF_EXPONENT for rank in range(num_fillers)))

    def filler(self, rng: random.Random, k: int = 1) -> list[str]:
        """K Zipfian filler words."""
        return rng.choices(self.fillers, cum_weights=self.cum_weights, k=k)

    def agreement(self, rng: random.Random) -> list[str]:
        j = rng.randrange(NUM_PAIRS)
        before = self.filler(rng, rng.randint(0, 3))
        between = self.filler(rng, AGREEMENT_DISTANCE - 1)
        after = self.filler(rng, rng.randint(0, 3))
        return before + [self.subjects[j]] + between + [self.markers[j]] + after

    def brackets(self, rng: random.Random) -> list[str]:
        out: list[str] = []
        stack: list[int] = []
        for _ in range(rng.randint(2, 6)):
            while len(stack) < 4 and (not stack or rng.random() < 0.5):
                pair = rng.randrange(len(BRACKETS))
                stack.append(pair)
                out += [BRACKETS[pair][0]] + self.filler(rng, rng.randint(0, 2))
            out += [BRACKETS[stack.pop()][1]] + self.filler(rng, rng.randint(0, 1))
        while stack:
            out += [BRACKETS[stack.pop()][1]]
        return out

    def copy(self, rng: random.Random) -> list[str]:
        span = self.filler(rng, rng.randint(3, 8))
        return span + ["echo"] + span

    def counting(self, rng: random.Random) -> list[str]:
        start = rng.randrange(len(NUMBERS) - 3)
        length = rng.randint(3, len(NUMBERS) - start)
        return NUMBERS[start : start + length]

    def plain(self, rng: random.Random) -> list[str]:
        return self.filler(rng, rng.randint(4, 12))

    def document(self, rng: random.Random) -> str:
        """One document: 3-12 sentences of random rules."""
        rules = (self.agreement, self.brackets, self.copy, self.counting, self.plain)
        sentences = [" ".join(rng.choice(rules)(rng)) + " ." for _ in range(rng.randint(3, 12))]
        return " ".join(sentences)


def generate_documents(num_documents: int, seed: int = 0) -> Iterator[str]:
    """Yield `num_documents` documents, deterministic from `seed` (document i is the same for any total)."""
    corpus = BuiltinCorpus(seed)
    for i in range(num_documents):
        yield corpus.document(random.Random(f"{seed}/{i}"))


def write_corpus(path: str | Path, num_documents: int, seed: int = 0) -> Path:
    """Write the corpus as UTF-8 text, documents separated by a blank line (as `source: text` reads them)."""
    path = Path(path)

    def write(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as f:
            for doc in generate_documents(num_documents, seed):
                f.write(doc + "\n\n")

    atomic_write(path, write)  # all or nothing: a full disk leaves no truncated corpus to train on
    return path
