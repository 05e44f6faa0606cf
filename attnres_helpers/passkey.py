"""Passkey retrieval: can a model read back a number it saw d tokens ago? (plan v3, notebook 08)

The task of Mohtashami & Jaggi (2023), made to give many trials per forward pass. Into a window of
ordinary text, short sentences are written over the text (the window keeps its length, so every position
is exact): a **key sentence** ``" The pass key for the apple is 48213. Remember it. The pass key for the
apple is 48213."`` and, d tokens later, a **query** ``" What is the pass key for the apple? The pass key
for the apple is 48213."``.
The query's digits are scored teacher-forced: the log-probability of the key's tokens given everything
before them, and whether each is the model's top-1 choice. A trial **passes** when every digit is top-1.

Each window holds many trials, each with its own name (``apple``, ``river``, …) and its own
random key, so a query must find the one sentence that names it among the others. Two controls:

- **ceiling**: the query right after its key sentence (d = the key sentence's length);
- **chance**: a query for a name whose key sentence is not in the window (``absent``): nothing to
  retrieve, the digits random; a model that ignores its context scores here (exact match ~10⁻⁵).

The distance d is from the first digit of the key's last statement in the key sentence to the query's
first digit, in tokens. The format was chosen by a pilot (``data/results/configurations_plan_v3.md``). Which
trials sit where is drawn by ``numpy.random.default_rng(seed)`` per window, so every configuration of a
model reads the same windows with the same trials. A model that copies exactly scores 1 at every
distance; one that ignores its context scores the absent control at every distance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

NAMES = tuple(
    "apple river candle mountain garden window violin rabbit castle forest bottle camera pencil island rocket "
    "tiger dragon planet silver anchor butter cactus dolphin engine falcon guitar hammer jacket kettle lemon "
    "magnet needle orange parrot quartz ribbon saddle tunnel umbrella velvet walnut zebra bridge cloud desert "
    "eagle feather glacier harbor jungle lantern meadow nectar oyster pepper rainbow spider thunder valley "
    "whistle lizard marble tomato carpet basket helmet pillow mirror ladder compass blanket tractor penguin "
    "coffee diamond trumpet honey canyon lobster sunset".split()
)  # 80 distinct words (one token each for SmolLM2); a window uses each at most once
KEY_DIGITS = 5
KEY_SENTENCE = " The pass key for the {name} is {key}. Remember it. The pass key for the {name} is {key}."
QUERY_SENTENCE = " What is the pass key for the {name}? The pass key for the {name} is {key}."
KINDS = ("trial", "ceiling", "absent")
DISTANCE_FRACTIONS = (1 / 16, 1 / 4, 1 / 2, 0.9, 1.1, 1.5, 1.9)  # of L: from well inside L to past it


def distances_for(train_len: int, window: int) -> tuple[int, ...]:
    """The plan's distances (fractions of L, rounded to whole tokens) that fit a window of ``window`` tokens."""
    if isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 16:
        raise ValueError(f"train_len must be an integer >= 16, got {train_len!r}")
    return tuple(int(round(f * train_len)) for f in DISTANCE_FRACTIONS if round(f * train_len) < window - 64)


@dataclass(frozen=True)
class Trial:
    """One query: its name and key, its kind, where its digits are scored (``query_at``: the position of
    the first digit's *target*, so the digits are targets query_at … query_at + len − 1) and where the key
    sentence's first digit is (``key_at``, -1 for the absent control); ``distance = query_at − key_at``."""

    name: str
    key: str
    kind: str
    key_at: int
    query_at: int

    @property
    def distance(self) -> int:
        return -1 if self.kind == "absent" else self.query_at - self.key_at


@dataclass(frozen=True)
class Layout:
    """A window with its sentences written in: ``tokens (T+1,)`` int64, the trials, and ``inserted (T,)``
    bool, True for each target position inside a written sentence (left out of the text's NLL)."""

    tokens: torch.Tensor
    trials: tuple[Trial, ...]
    inserted: torch.Tensor


Tokenize = Callable[[str], list[int]]


def _sentence(tokenize: Tokenize, template: str, name: str, key: str) -> tuple[list[int], int]:
    """(token ids of the sentence, index of its first digit token); the key must be KEY_DIGITS tokens."""
    ids = tokenize(template.format(name=name, key=key))
    prefix = tokenize(template.format(name=name, key=key).rsplit(key, 1)[0])
    key_ids = tokenize(key)
    if (
        len(key_ids) != KEY_DIGITS
        or ids[: len(prefix)] != prefix
        or ids[len(prefix) : len(prefix) + KEY_DIGITS] != key_ids
    ):
        raise ValueError(
            f"the tokenizer does not give the key of {template!r} as {KEY_DIGITS} tokens of its own "
            "after the sentence's prefix (a tokenizer that merges digits cannot run this probe)"
        )
    return ids, len(prefix)


Wanted = tuple[str, int, str | None]  # (kind, distance, region of the query: "past", "inside" or None)
NEAR_FRACTIONS = (1 / 16, 1 / 8, 1 / 4)  # plan v4: distances the model reaches inside L
FAR_FRACTIONS = (1.1, 1.5, 1.9)  # plan v4: distances past L


def wanted_v4(train_len: int, T: int, per_distance: int = 2) -> list[Wanted]:
    """Plan v4's trials for a window of T tokens: in a window past L, ``per_distance`` at each far
    distance, at each near distance with the query past L and again inside L, 2 ceilings past L, 1
    inside, 2 absent; in a window of at most L, ``per_distance`` at each near distance, 2 ceilings, 2 absent."""
    near = [int(round(f * train_len)) for f in NEAR_FRACTIONS]
    if T <= train_len:
        return (
            [("trial", d, None) for d in near for _ in range(per_distance)]
            + [("ceiling", 0, None)] * 2
            + [("absent", 0, None)] * 2
        )
    far = [int(round(f * train_len)) for f in FAR_FRACTIONS if round(f * train_len) < T - 64]
    out = [("trial", d, "past") for d in sorted(far, reverse=True) for _ in range(per_distance)]
    out += [("trial", d, region) for region in ("past", "inside") for d in near for _ in range(per_distance)]
    return out + [("ceiling", 0, "past")] * 2 + [("ceiling", 0, "inside")] + [("absent", 0, None)] * 2


def layout(
    text: torch.Tensor,
    tokenize: Tokenize,
    distances: Sequence[int],
    trials_per_distance: int = 2,
    n_ceiling: int = 2,
    n_absent: int = 2,
    seed: int = 0,
    max_tries: int = 2000,
    wanted: Sequence[Wanted] | None = None,
    split: int | None = None,
) -> Layout:
    """Write trials into ``text (T+1,)``: ``trials_per_distance`` at each distance, the ceiling and
    absent controls, each with a distinct name and a random key, at random places that do not overlap
    (drawn by ``numpy.random.default_rng(seed)``). The last target is never inside a sentence.
    ``wanted`` (with ``split``, e.g. :func:`wanted_v4`) lists the trials instead, each with the region
    of its query: ``"past"`` (the whole query at positions ≥ split), ``"inside"`` (before split) or None."""
    if text.ndim != 1 or text.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"text must be a 1-D tensor of token ids, got {text.dtype} {tuple(text.shape)}")
    T = len(text) - 1
    if wanted is None:
        wanted = [("trial", d, None) for d in sorted(distances, reverse=True) for _ in range(trials_per_distance)]
        wanted += [("ceiling", 0, None)] * n_ceiling + [("absent", 0, None)] * n_absent
    elif any(region is not None for _, _, region in wanted) and split is None:
        raise ValueError("trials placed past or inside a split need the split")
    if len(wanted) > len(NAMES):
        raise ValueError(f"{len(wanted)} trials need more than the {len(NAMES)} names")
    rng = np.random.default_rng(seed)
    names = [NAMES[i] for i in rng.permutation(len(NAMES))[: len(wanted)]]
    tokens, inserted = text.clone().long(), torch.zeros(T, dtype=torch.bool)
    busy = np.zeros(T + 1, dtype=bool)  # token positions already written
    placed = []

    def free(start: int, n: int) -> bool:
        return start >= 1 and start + n <= T and not busy[start - 1 : start + n + 1].any()

    def write(start: int, ids: list[int]) -> None:
        tokens[start : start + len(ids)] = torch.tensor(ids)
        busy[start : start + len(ids)] = True
        inserted[start - 1 : start + len(ids) - 1] = True  # targets of the written tokens

    for (kind, d, region), name in zip(wanted, names):
        key = "".join(str(x) for x in rng.integers(0, 10, KEY_DIGITS))
        k_ids, k_digit = _sentence(tokenize, KEY_SENTENCE, name, key)
        q_ids, q_digit = _sentence(tokenize, QUERY_SENTENCE, name, key)
        if kind == "ceiling":
            d = len(k_ids) - k_digit + q_digit
        for _ in range(max_tries):
            if kind == "absent":
                q_start = int(rng.integers(1, T - len(q_ids)))
                if free(q_start, len(q_ids)):
                    write(q_start, q_ids)
                    placed.append(Trial(name, key, kind, -1, q_start + q_digit - 1))
                    break
                continue
            if region is None:
                k_start = int(rng.integers(1, max(2, T - d - len(q_ids))))
                q_start = k_start + k_digit + d - q_digit
            else:
                low, high = (split, T - len(q_ids)) if region == "past" else (1, split - len(q_ids))
                q_start = int(rng.integers(low, max(low + 1, high)))
                k_start = q_start - k_digit - d + q_digit
            if kind == "ceiling":
                fits = free(k_start, len(k_ids) + len(q_ids))
            else:
                fits = q_start > k_start + len(k_ids) and free(k_start, len(k_ids)) and free(q_start, len(q_ids))
            if fits:
                write(k_start, k_ids)
                write(q_start, q_ids)
                placed.append(Trial(name, key, kind, k_start + k_digit - 1, q_start + q_digit - 1))
                break
        else:
            raise ValueError(f"no room for a {kind} trial at distance {d} in a window of {T} tokens")
    return Layout(tokens, tuple(placed), inserted)


def digit_targets(trial: Trial) -> torch.Tensor:
    """The target positions of a trial's digits in the query, (KEY_DIGITS,) int64."""
    return torch.arange(trial.query_at, trial.query_at + KEY_DIGITS)


@dataclass(frozen=True)
class TrialScores:
    """Per trial of one window: ``logprob`` (n,) float64, the sum of the digits' log-probabilities,
    and ``correct`` (n,) int64, how many of the KEY_DIGITS digits are the model's top-1 choice."""

    logprob: torch.Tensor
    correct: torch.Tensor

    @property
    def passed(self) -> torch.Tensor:
        return self.correct == KEY_DIGITS


def score(log_probs_at: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor, trials: Sequence[Trial]):
    """Teacher-forced scores of ``trials``. ``log_probs_at(positions (m,)) -> (m, V)`` gives the model's
    log-probabilities for the targets at those positions (target t is token t + 1 of ``tokens``)."""
    positions = torch.cat([digit_targets(t) for t in trials]) if trials else torch.empty(0, dtype=torch.long)
    if not len(positions):
        return TrialScores(torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.int64))
    log_probs = log_probs_at(positions).double()  # (m, V)
    targets = tokens[positions + 1]
    chosen = log_probs.gather(-1, targets[:, None])[:, 0].view(len(trials), KEY_DIGITS)
    top = (log_probs.argmax(-1) == targets).view(len(trials), KEY_DIGITS)
    return TrialScores(chosen.sum(-1), top.sum(-1).long())
