"""How an encoder-decoder searches for targets: `SearchConfig`, the one object of its decoding settings.

HF's `GenerationConfig` for our search (`roformer.model.beam`): beams, the length penalty, early stopping and the
length limit, under HF `generate`'s names, with fairseq's `max_len_a` beside `max_new_tokens` (fairseq's `max_len_b`).
`EncoderDecoder.generate` takes one; the `translation` type builds one from its config section (`data.translation`)
and writes it in `translation.json` beside every model it trains, which `roformer translate` reads back.

The values are checked once, here: a bad one raises `SearchValueError`, which names its field, so that a caller can
name it as its users write it (`data.translation.beam`, `--beam`). Plain Python: no torch import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import Tensor


class SearchValueError(ValueError):
    """A search setting out of range: the field, and what is wrong with its value.

    Args:
        field: The setting, as the message names it (a `SearchConfig` field, or a caller's name for it).
        problem: What is wrong, with the value (`must be >= 1, got 0`).
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class SearchConfig:
    """How targets are searched for (the defaults: HF `generate`'s, with 200 new tokens at most).

    Attributes:
        num_beams: Beams per source; 1 = greedy decoding.
        length_penalty: A hypothesis scores sum logprob / length^length_penalty (0: the plain sum; > 0 favours
            longer ones; fairseq's lenpen, 1.0 as HF's default; the paper's setup uses beam 4 and 0.6).
        early_stopping: True, False or "never" (HF's `early_stopping`; see `roformer.model.beam`).
        max_new_tokens: Generated tokens at most (eos included) besides max_len_a's share: fairseq's max_len_b. A
            row generates at least one token.
        max_len_a: Further tokens per real source token (fairseq's max_len_a).

    Raises:
        SearchValueError: a value out of range (a beam count < 1, a penalty that is not a finite number, ...).
    """

    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    max_new_tokens: int = 200
    max_len_a: float = 0.0

    def __post_init__(self) -> None:
        if self.num_beams < 1:
            raise SearchValueError("num_beams", f"must be >= 1, got {self.num_beams}")
        for name in ("length_penalty", "max_len_a"):  # nan passes every range check, and reorders the beams
            if not math.isfinite(getattr(self, name)):
                raise SearchValueError(name, f"must be a finite number, got {getattr(self, name)}")
        if self.early_stopping not in (True, False, "never"):
            raise SearchValueError("early_stopping", f"must be true, false or 'never', got {self.early_stopping!r}")
        for name in ("max_new_tokens", "max_len_a"):
            if getattr(self, name) < 0:
                raise SearchValueError(name, f"must be >= 0, got {getattr(self, name)}")

    def limits(self, source_lengths: Tensor) -> Tensor:
        """(B,) real source tokens -> (B,) long: the most tokens each row may generate (at least 1)."""
        return (self.max_len_a * source_lengths.double() + self.max_new_tokens).long().clamp(min=1)
