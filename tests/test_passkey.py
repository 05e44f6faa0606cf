"""The passkey probe (plan v3) on known answers: a copier scores 1, a model blind to its context chance."""

import pytest
import torch

from attnres_helpers import passkey

VOCAB = 64
DIGITS = {str(d): 10 + d for d in range(10)}
WORDS: dict[str, int] = {}


def tokenize(text: str) -> list[int]:
    """A toy tokenizer: one token per digit, one per word (ids from 20 up)."""
    out = []
    for piece in text.replace("?", " ?").replace(".", " .").split(" "):
        if not piece:
            continue
        if piece.isdigit():
            out += [DIGITS[c] for c in piece]
        else:
            out.append(WORDS.setdefault(piece, 20 + len(WORDS) % (VOCAB - 20)))
    return out


def text(T: int) -> torch.Tensor:
    return torch.randint(2, 10, (T + 1,), generator=torch.Generator().manual_seed(0))


def copier(tokens: torch.Tensor, trials):
    """Log-probabilities of a model that reads each query's key from its key sentence (exact copy)."""
    answer = {}
    for t in trials:
        if t.kind != "absent":
            for i in range(passkey.KEY_DIGITS):
                answer[t.query_at + i] = int(tokens[t.key_at + i + 1])

    def log_probs_at(positions):
        out = torch.full((len(positions), VOCAB), -20.0)
        for row, p in enumerate(positions.tolist()):
            out[row, answer.get(p, 0)] = 0.0
        return out

    return log_probs_at


def blind(positions):
    """The same prediction everywhere, whatever the context: digits uniform."""
    out = torch.full((len(positions), VOCAB), -50.0)
    out[:, 10:20] = torch.log(torch.tensor(0.1))
    return out


@pytest.fixture(scope="module")
def window():
    return passkey.layout(text(4096), tokenize, passkey.distances_for(2048, 4097), seed=3)


def test_layout_places_every_trial_at_its_distance_without_overlap(window):
    distances = passkey.distances_for(2048, 4097)
    trials = [t for t in window.trials if t.kind == "trial"]
    assert sorted(t.distance for t in trials) == sorted(d for d in distances for _ in range(2))
    assert [t.kind for t in window.trials].count("ceiling") == 2 and [t.kind for t in window.trials].count(
        "absent"
    ) == 2
    assert len({t.name for t in window.trials}) == len(window.trials)  # one name per trial
    for t in window.trials:  # the query's digits are the key, where the layout says
        assert window.tokens[passkey.digit_targets(t) + 1].tolist() == [DIGITS[c] for c in t.key]
        if t.kind != "absent":
            assert window.tokens[t.key_at + 1 : t.key_at + 6].tolist() == [DIGITS[c] for c in t.key]
    assert window.inserted.sum() > 0 and not window.inserted[-1]
    untouched = ~torch.cat([window.inserted, torch.tensor([True])]).roll(1)
    assert torch.equal(window.tokens[untouched], text(4096)[untouched])  # the text elsewhere is unchanged


def test_a_copier_scores_one_and_a_blind_model_chance(window):
    copied = passkey.score(copier(window.tokens, window.trials), window.tokens, window.trials)
    kinds = [t.kind for t in window.trials]
    for passed, kind in zip(copied.passed.tolist(), kinds):
        assert passed == (kind != "absent")
    blinded = passkey.score(blind, window.tokens, window.trials)
    assert not blinded.passed.any()
    assert torch.allclose(blinded.logprob, torch.full_like(blinded.logprob, 5 * torch.log(torch.tensor(0.1)).item()))


def test_same_seed_same_trials_other_seed_others():
    a = passkey.layout(text(2048), tokenize, (64, 512), seed=1)
    b = passkey.layout(text(2048), tokenize, (64, 512), seed=1)
    c = passkey.layout(text(2048), tokenize, (64, 512), seed=2)
    assert a.trials == b.trials and torch.equal(a.tokens, b.tokens)
    assert a.trials != c.trials


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no room"):
        passkey.layout(text(200), tokenize, (150, 150, 150), trials_per_distance=4)
    with pytest.raises(ValueError, match="1-D tensor"):
        passkey.layout(text(200).float(), tokenize, (10,))
    with pytest.raises(ValueError, match="merges digits"):
        passkey.layout(text(400), lambda s: [4 if w.strip(".?").isdigit() else 3 for w in s.split()], (10,))
    with pytest.raises(ValueError, match="train_len"):
        passkey.distances_for(8, 100)
