"""The encoding registry: every trainable encoding has a complete entry that the model implements (through
its ``positions.ENCODING_POSITIONS`` entry, model.py never naming an encoding), and every list of encodings
elsewhere is read from it. A failure says what to add."""

import ast
import math
import re

import pytest
import torch
from matplotlib.colors import is_color_like

from attnres_helpers import family_plots, model, positions, tables
from attnres_helpers.encoding_registry import ENCODINGS, POSITIONS, TABLE_ORDER, design_params
from attnres_helpers.encodings import DESIGN_CURVES, resolution_pair
from attnres_helpers.stats import design_resolution
from attnres_helpers.widgets.design_figures import CURVE_STYLES

# What the notebooks show today: notebook 05's colours (in its legends' order) and the tables' rows.
SHOWN_COLOURS = {
    "rope": "C0",
    "xpos": "C1",
    "alibi": "C2",
    "sinusoidal": "C3",
    "nope": "C4",
    "t5": "C5",
    "kerple": "C6",
}
SHOWN_ROWS = ("rope", "sinusoidal", "alibi", "xpos", "nope", "kerple", "t5")


@pytest.mark.parametrize("name", ENCODINGS)
def test_every_entry_is_complete(name):
    entry = ENCODINGS[name]
    assert entry.name == name, f"ENCODINGS[{name!r}] is named {entry.name!r}"
    assert entry.design_curve in DESIGN_CURVES, (
        f"{name}: its design curve {entry.design_curve!r} is not in encodings.DESIGN_CURVES: add it there or name one"
    )
    assert entry.position in POSITIONS, f"{name}: position {entry.position!r} is not one of {POSITIONS}"
    assert isinstance(entry.learned_per_head, int) and entry.learned_per_head >= 0
    assert is_color_like(entry.colour), f"{name}: colour {entry.colour!r} is not a matplotlib colour"
    config = model.preset("default", encoding=name).to_dict()
    params = design_params(name, config)
    r_pair = resolution_pair(entry.design_curve, 64, **params)
    assert all(math.isfinite(r) for r in r_pair)
    assert design_resolution(name, config, 64) == r_pair


@pytest.mark.parametrize("name", ENCODINGS)
def test_the_model_implements_every_entry(name):
    """Built, trained one step, its parameters counted, BCA where relative, and a position signal in its
    scores unless its position is "none": a repeated token gives every key the same score without one."""
    torch.manual_seed(0)
    cfg = model.preset("tiny", encoding=name)
    net = cfg.build()
    plain = {k for k, _ in model.preset("tiny", encoding="nope").build().named_parameters()}
    learned = {k: p for k, p in net.named_parameters() if k not in plain}
    assert sum(p.numel() for p in learned.values()) == ENCODINGS[name].learned_per_head * cfg.n_head * cfg.n_layer, (
        f"{name}: learned_per_head does not count the bias parameters model.py gives it"
    )
    assert cfg.n_parameters == sum(p.numel() for p in net.parameters())
    x = torch.randint(0, 256, (2, 2 * cfg.train_len))
    _, loss = net(x, x)
    loss.backward()
    assert math.isfinite(loss.item())
    assert net.supports_bca == ENCODINGS[name].relative
    if net.supports_bca:
        net(x, bca=True)
    else:
        with pytest.raises(ValueError, match="relative"):
            net(x, bca=True)
    with torch.no_grad():
        for p in learned.values():  # learned biases start flat (T5's zero table): give them values
            p.uniform_(0.2, 2.0)
    _, scores = net.forward_with_scores(torch.full((1, cfg.train_len), 7))
    last = scores[0][0, :, -1, :]  # (H, T): the last query's scores of every key
    spread = (last.max(dim=-1).values - last.min(dim=-1).values).max().item()
    if ENCODINGS[name].position == "none":
        assert spread < 1e-5
    else:
        assert spread > 1e-4, f"{name}: the model puts no position into the scores: give it a Position in positions.py"


def test_every_list_of_encodings_is_the_registrys():
    assert model.MODEL_ENCODINGS == tuple(ENCODINGS)
    assert list(positions.ENCODING_POSITIONS) == list(ENCODINGS), "positions.ENCODING_POSITIONS: one per entry"
    assert family_plots.FAMILY_COLOURS == {name: e.colour for name, e in ENCODINGS.items()}
    assert list(family_plots.FAMILY_COLOURS) == list(ENCODINGS)  # the legends' order
    assert sorted(e.table_order for e in ENCODINGS.values()) == list(range(len(ENCODINGS))), "table_order: 0, 1, ..."
    assert tables.table_ordered(["zz other", *reversed(ENCODINGS)]) == [*TABLE_ORDER, "zz other"]
    assert CURVE_STYLES == {name: curve.style for name, curve in DESIGN_CURVES.items()}
    for name, curve in DESIGN_CURVES.items():
        assert is_color_like(curve.style.get("color")), f"design curve {name}: give it a style with a colour"


def test_what_the_notebooks_show_is_kept():
    assert {name: ENCODINGS[name].colour for name in SHOWN_COLOURS} == SHOWN_COLOURS
    assert list(SHOWN_COLOURS) == list(ENCODINGS)[: len(SHOWN_COLOURS)]
    assert tuple(name for name in TABLE_ORDER if name in SHOWN_ROWS) == SHOWN_ROWS
    assert (ENCODINGS["t5"].design_curve, ENCODINGS["kerple"].design_curve) == ("nope", "kerple-log")


def test_design_params_of_an_unknown_encoding():
    with pytest.raises(ValueError, match="no design-time curve for encoding 'fire'; known: rope, xpos"):
        design_params("fire", model.preset("default").to_dict())
    with pytest.raises(ValueError, match="no design-time curve"):
        design_params(["rope"], model.preset("default").to_dict())


@pytest.mark.parametrize("name", ENCODINGS)
def test_each_position_does_what_its_entry_says(name):
    """The Position of an entry acts where its kind says: an absolute one on the embeddings alone, a rotary one
    on q and k alone, a bias on the scores alone (with as many learned parameters a head as the entry says),
    none nowhere."""
    cfg = model.preset("tiny", encoding=name)
    position, kind = positions.ENCODING_POSITIONS[name], ENCODINGS[name].position
    assert isinstance(position, positions.Position), f"{name}: ENCODING_POSITIONS holds no Position"
    T = cfg.train_len
    layer = model.CausalSelfAttention(cfg)
    tables = position.tables(cfg, T, "cpu")
    x, q = torch.randn(1, T, cfg.d_model), torch.randn(1, cfg.n_head, T, cfg.head_dim)
    embedded = not torch.equal(position.embed(x, cfg), x)
    rotated = not torch.equal(position.rotate(q, q, tables)[0], q)
    biased = position.score_bias(tables, layer) is not None
    assert (embedded, rotated, biased) == (kind == "absolute", kind == "rotary", kind == "bias"), name
    learned = sum(p.numel() for p in position.layer_parameters(cfg).values())
    assert learned == ENCODINGS[name].learned_per_head * cfg.n_head


MODEL_SOURCE = (model.__file__, open(model.__file__).read())


def test_model_py_names_no_encoding():
    """model.py calls an encoding's Position and never asks which encoding it has: no ``encoding ==``,
    ``!=`` or ``in``, and no encoding's name (as a word, a string, anywhere in the file)."""
    path, source = MODEL_SOURCE
    branches = re.findall(r"encoding\s*(?:==|!=|in\b)", source)
    assert not branches, f"{path} branches on the encoding: {branches}"
    strings = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & set(ENCODINGS), f"{path} names encodings {sorted(strings & set(ENCODINGS))}"
    words = sorted({w for w in re.findall(r"\b\w+\b", source) if w in ENCODINGS})
    assert not words, f"{path} names encodings {words}: say it in positions.py"
