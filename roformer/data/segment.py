"""Token ids of texts with each token's exact character span in the original text, for plain and jieba tokenizers.

Word-level Chinese tokenizers (WoBERT, RoFormer-Chinese) were pretrained on text that jieba cut into words first
(`data.jieba`). Tasks that point back into the text (extractive QA answers, tags of words) need every token's
characters in the text as given, so the words are not joined with spaces and re-tokenized: each text is cut with
`jieba.tokenize` (word, start, end), the words are tokenized as pre-split words (`is_split_into_words`), and each
token's span inside its word is moved by the word's start. Without jieba the tokenizer's own offsets are used (its
normaliser keeps them pointing at the original text). Either way the result has one shape, so callers have one path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from roformer.data.tokenizer import jieba_words, spelled_out, word_vocabulary

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer


@dataclass(frozen=True)
class TokenizedText:
    """One text's tokens, special tokens excluded.

    Attributes:
        ids: Token ids.
        offsets: Each token's characters in the text: `text[start:end]` is what the token came from (before the
            tokenizer's normalisation: lower-casing, accents; a character split into several tokens gives them all
            its span).
    """

    ids: list[int]
    offsets: list[tuple[int, int]]


def tokenize_texts(tokenizer: Tokenizer, texts: list[str], jieba: bool = False) -> list[TokenizedText]:
    """Every text's token ids and the character span of each token in the text (no special tokens).

    Args:
        tokenizer: A fast tokenizer (offsets need one).
        texts: The texts.
        jieba: Cut each text into words with jieba first, as word-level Chinese tokenizers were pretrained.
    """
    if not texts:
        return []
    if not jieba:
        out = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            TokenizedText(ids, [tuple(o) for o in offsets])
            for ids, offsets in zip(out["input_ids"], out["offset_mapping"])
        ]
    vocab = word_vocabulary(tokenizer)  # a word-level tokenizer: its words stay whole, the others are spelled out
    words = [spelled_out(jieba_words(text), vocab) if vocab else jieba_words(text) for text in texts]
    result = [TokenizedText([], []) for _ in texts]
    cut = [i for i, w in enumerate(words) if w]  # an empty text has no words (the tokenizer refuses an empty list)
    if not cut:
        return result
    out = tokenizer(
        [[w for w, _, _ in words[i]] for i in cut],
        is_split_into_words=True,
        add_special_tokens=False,
        return_offsets_mapping=True,
    )
    for row, i in enumerate(cut):
        starts = [start for _, start, _ in words[i]]
        # with pre-split words the tokenizer's offsets are within each word
        offsets = [
            (starts[word] + a, starts[word] + b) for word, (a, b) in zip(out.word_ids(row), out["offset_mapping"][row])
        ]
        result[i] = TokenizedText(out["input_ids"][row], offsets)
    return result
