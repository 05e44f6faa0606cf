"""The trained-model explorer without a kernel (attnres_helpers.widgets.trained and trained_figure): its
state and readout against the stored records, its widget driven by .value, and other stores (a family, a
pretrained model's, bad ones)."""

import asyncio
import math
import re

import numpy as np
import pytest
import torch
from helpers import part, past_the_redraw_timer
from matplotlib.ticker import NullFormatter

from attnres_helpers import experiments
from attnres_helpers.metric import BOUNDARIES, HEAD_MODES, resolution
from attnres_helpers.paths import STORES
from attnres_helpers.store import Profile, load_profiles, save_profiles
from attnres_helpers.store import records as store_records
from attnres_helpers.widgets import (
    TrainedFigure,
    format_sig,
    trained_catalogue,
    trained_explorer,
    trained_readout_html,
    trained_state,
)
from attnres_helpers.widgets.render import PNG_SIGNATURE

NUMBER = r"(-?\d+(?:\.\d+)?(?:e[-+]\d+)?|undefined)"
PAIR = re.compile(rf"R\(L\) = {NUMBER} .*R\(2L\) = {NUMBER} .*R\(2L\)/R\(L\) = {NUMBER}")
PNG = PNG_SIGNATURE


@pytest.fixture(scope="module")
def shipped_records():
    profiles, _ = load_profiles(experiments.STORE)
    return {b: store_records(profiles, boundary=b) for b in BOUNDARIES}


def test_trained_readout_equals_the_stored_records(catalogue, shipped_records):
    """For every run, eval length, mask, layer (and the layer mean), head convention and boundary,
    the explorer's R is the record's R."""
    checked = 0
    for boundary, recs in shipped_records.items():
        for rec in recs:
            if rec["layer"] == "upper":
                continue
            k = rec["eval_len"] // rec["train_len"]
            state = trained_state(catalogue, rec["encoding"], rec["seed"], rec["layer"], "mean", k, rec["bca"])
            assert state["run"] == rec["run"]
            assert state["R"][rec["head_mode"], boundary] == pytest.approx(rec["resolution"], rel=1e-12, abs=1e-15)
            checked += 1
    assert checked == sum(1 for recs in shipped_records.values() for r in recs if r["layer"] != "upper") > 1000


def test_trained_readout_text_shows_every_convention(catalogue, shipped_records):
    state = trained_state(catalogue, "rope", 0, 2, "mean", 2, False)
    text = trained_readout_html(state)
    for boundary in BOUNDARIES:
        for head_mode in HEAD_MODES:
            rec = next(
                r
                for r in shipped_records[boundary]
                if (r["run"], r["eval_len"], r["bca"], r["layer"], r["head_mode"])
                == ("rope-s0", 2 * state["train_len"], False, 2, head_mode)
            )
            assert f">{format_sig(rec['resolution'])}<" in text
        assert f"boundary {boundary}" in text
    assert f"positions &lt; L {format_sig(rec['perplexity_first_L'])}" in text
    assert f"positions ≥ L {format_sig(rec['perplexity_past_L'])}" in text


def test_one_head_gives_its_own_R_under_both_conventions(catalogue):
    state = trained_state(catalogue, "alibi", 1, 3, 2, 4, False)
    s = catalogue["index"]["alibi", 1, 4 * catalogue["train_len"], False].s_hat.double()[3, 2]  # (T,)
    for boundary in BOUNDARIES:
        expected = float(resolution(s, boundary))
        assert (
            state["R"]["mean-scores", boundary] == state["R"]["mean-R", boundary] == pytest.approx(expected, rel=1e-12)
        )
    assert "one head" in trained_readout_html(state)


def test_trained_weights_and_perplexity(catalogue):
    L = catalogue["train_len"]
    state = trained_state(catalogue, "xpos", 0, "mean", "mean", 4, True)
    assert state["weights"].shape == (catalogue["layers"], 4 * L)
    assert np.allclose(state["weights"].sum(-1), 1.0)
    assert np.all(state["weights"][:, L:] == 0) and np.all(np.isneginf(state["scores"][:, L:]))  # BCA: n >= L masked
    nll = catalogue["index"]["xpos", 0, 4 * L, True].nll.numpy()
    assert np.allclose(np.log(state["ppl"]), nll)
    assert state["perplexity_first_L"] == pytest.approx(math.exp(nll[:L].mean()))
    at_L = trained_state(catalogue, "xpos", 0, eval_multiple=1)
    assert at_L["perplexity_past_L"] is None and "no positions ≥ L" in trained_readout_html(at_L)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(encoding="sinusoidal", seed=0, bca=True), "no BCA profiles"),
        (dict(encoding="rotary", seed=0), "encoding must be one of"),
        (dict(encoding="rope", seed=7), r"seed \(for rope\) must be one of \[0, 1, 2\]"),
        (dict(encoding="rope", seed=0, layer=4), "layer must be one of"),
        (dict(encoding="rope", seed=0, head=True), "head must be one of"),
        (dict(encoding="rope", seed=0, eval_multiple=3), "eval_multiple"),
        (dict(encoding="rope", seed=0, bca=1), "bca must be True or False"),
    ],
)
def test_trained_state_rejects_bad_choices(catalogue, kwargs, message):
    with pytest.raises(ValueError, match=message):
        trained_state(catalogue, **kwargs)


def test_trained_explorer_widget(catalogue):
    ui = trained_explorer(experiments.STORE)
    readout, error = part(ui, "attnres-trained-readout"), part(ui, "attnres-error")
    assert readout.value == trained_readout_html(trained_state(catalogue, "rope", 0, "mean", "mean", 2, False))
    part(ui, "attnres-t-layer").value = 1
    assert readout.value == trained_readout_html(trained_state(catalogue, "rope", 0, 1, "mean", 2, False))
    part(ui, "attnres-t-bca").value = True
    assert readout.value == trained_readout_html(trained_state(catalogue, "rope", 0, 1, "mean", 2, True))
    bca, note = part(ui, "attnres-t-bca"), part(ui, "attnres-t-bca-note")
    part(ui, "attnres-t-encoding").value = "sinusoidal"  # no BCA profiles: unticked, disabled, and why
    assert bca.disabled and not bca.value and "BCA is disabled for sinusoidal" in note.value
    assert readout.value == trained_readout_html(trained_state(catalogue, "sinusoidal", 0, 1, "mean", 2, False))
    part(ui, "attnres-t-encoding").value = "alibi"
    assert not bca.disabled and note.value == ""
    part(ui, "attnres-t-head").value = 3
    part(ui, "attnres-t-eval").value = 4
    assert readout.value == trained_readout_html(trained_state(catalogue, "alibi", 0, 1, 3, 4, False))
    assert error.layout.display == "none"
    assert bytes(part(ui, "attnres-trained-plot").value).startswith(PNG)


def test_trained_figure_marks_L(catalogue):
    figure = TrainedFigure()
    figure.render(trained_state(catalogue, "rope", 0, eval_multiple=4))
    L = catalogue["train_len"]
    for ax in figure.axes:
        assert f"{L} (L)" in [t.get_text() for t in ax.get_xticklabels()]
        assert any(line.get_xdata()[0] == L for line in ax.get_lines() if len(line.get_xdata()) == 2)


def test_trained_readout_shows_R_without_the_sink(catalogue, shipped_records):
    """R without the first-token entries (n, 0), beside R, each equal to the store's own record."""
    checked = 0
    for rec in shipped_records["zero"]:
        if rec["layer"] in ("upper",) or rec["encoding"] != "rope":
            continue
        state = trained_state(
            catalogue, "rope", rec["seed"], rec["layer"], "mean", rec["eval_len"] // rec["train_len"], rec["bca"]
        )
        assert state["R_sink_free"][rec["head_mode"], "zero"] == pytest.approx(
            rec["resolution_sink_free"], rel=1e-12, abs=1e-15
        )
        checked += 1
    assert checked > 100
    state = trained_state(catalogue, "rope", 0, 1, "mean", 2, False)
    assert state["R_sink_free"]["mean-scores", "zero"] != state["R"]["mean-scores", "zero"]  # a different query
    text = trained_readout_html(state)
    assert "zero, no sink" in text and "drop, no sink" in text
    for mode in HEAD_MODES:
        assert f">{format_sig(state['R_sink_free'][mode, 'drop'])}<" in text


@pytest.fixture(scope="module")
def family_catalogue():
    return trained_catalogue(experiments.FAMILY_STORE)


def test_trained_explorer_on_a_family_store_chooses_the_setting(family_catalogue):
    """The family store holds six RoPE settings (bases) per seed: each is its own run, chosen by name
    and labelled, not collapsed into one (the index used to be keyed by encoding)."""
    profiles, _ = load_profiles(experiments.FAMILY_STORE)
    settings = sorted({p.meta["config"] for p in profiles if p.meta["encoding"] == "rope"})
    assert sorted(family_catalogue["settings"]["rope"]) == settings and len(settings) == 6
    assert sum(len(v) for v in family_catalogue["settings"].values()) == len({p.meta["config"] for p in profiles}) == 21
    with pytest.raises(ValueError, match="this store holds 6 settings of rope: choose one with setting="):
        trained_state(family_catalogue, "rope", 0, eval_multiple=2)
    recs = store_records(profiles)
    runs = set()
    for setting in settings:
        state = trained_state(family_catalogue, "rope", 0, "mean", "mean", 2, False, setting=setting)
        rec = next(
            r
            for r in recs
            if (r["config"], r["seed"], r["eval_len"], r["bca"], r["layer"], r["head_mode"])
            == (setting, 0, 2 * family_catalogue["train_len"], False, "mean", "mean-scores")
        )
        assert state["run"] == rec["run"] and state["R"]["mean-scores", "zero"] == pytest.approx(
            rec["resolution"], rel=1e-12
        )
        assert f"<b>rope · {setting}, seed 0</b>" in trained_readout_html(state)
        assert state["R_sink_free"]["mean-scores", "zero"] is None  # this store has no key-0 scores
        assert "n/a" in trained_readout_html(state) and "this store has no key-0 scores" in trained_readout_html(state)
        runs.add(state["run"])
    assert len(runs) == 6
    with pytest.raises(ValueError, match=r"setting \(for rope\) must be one of"):
        trained_state(family_catalogue, "rope", 0, setting="alibi slopes x1")


def test_trained_explorer_widget_on_a_family_store(family_catalogue):
    ui = trained_explorer(experiments.FAMILY_STORE)
    setting, readout = part(ui, "attnres-t-setting"), part(ui, "attnres-trained-readout")
    assert (
        setting.layout.display is None
        and not setting.disabled
        and list(setting.options) == family_catalogue["settings"]["rope"]
    )
    setting.value = "rope base 300"
    assert readout.value == trained_readout_html(
        trained_state(family_catalogue, "rope", 0, "mean", "mean", 2, False, "rope base 300")
    )
    part(ui, "attnres-t-encoding").value = "nope"  # one setting: shown, greyed out
    assert setting.disabled and list(setting.options) == ["nope"]
    part(ui, "attnres-t-encoding").value = "xpos"
    assert not setting.disabled and setting.value == family_catalogue["settings"]["xpos"][0]
    assert part(ui, "attnres-error").layout.display == "none"
    shipped = trained_explorer(experiments.STORE)
    assert (
        part(shipped, "attnres-t-setting").layout.display == "none"
    )  # the shipped store: the settings are the encodings


def test_trained_axes_stay_put_when_only_bca_or_the_length_changes(catalogue):
    """BCA on and off, and T = L, 2L, 4L, are drawn on the same axes, so they can be compared by eye."""
    figure = TrainedFigure()

    def axes_of(**kwargs):
        figure.render(trained_state(catalogue, "rope", 0, **kwargs))
        return [(ax.get_xlim(), ax.get_ylim()) for ax in figure.axes]

    for layer, head in (("mean", "mean"), (1, "mean"), (2, 3)):
        seen = {
            tuple(axes_of(layer=layer, head=head, eval_multiple=k, bca=bca)) for k in (1, 2, 4) for bca in (False, True)
        }
        assert len(seen) == 1, (layer, head)
    assert axes_of(layer=1, eval_multiple=2) != axes_of(layer=0, eval_multiple=2)  # a different layer may rescale


def test_trained_tick_labels_do_not_collide(catalogue):
    """At 4L the labels of L/2 and L ran into each other ("64128 (L)"): no two labels overlap now."""
    figure = TrainedFigure()
    figure.render(trained_state(catalogue, "rope", 0, eval_multiple=4))
    renderer = figure.fig.canvas.get_renderer()
    for ax in figure.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "128 (L)", "256 (2L)", "512 (4L)"]
        for a, b in zip(boxes, boxes[1:]):
            assert a.x1 + 2 <= b.x0, (a, b)  # at least 2 px apart
        assert boxes[-1].x1 <= figure.fig.bbox.x1


def test_a_figure_that_drew_another_stores_frame_draws_what_a_fresh_one_draws(catalogue):
    """Explorers share one figure (widgets.render.shared_figure): after SmolLM2's store (ticks 0, L, 2L; the
    last, 2L, right-aligned) the default store's 2L label is centred again, as on a figure that never drew."""
    figure = TrainedFigure()
    figure.render(trained_state(trained_catalogue(STORES["pretrained"]), "rope", 0))
    state = trained_state(catalogue, "rope", 0, eval_multiple=4)
    assert figure.render(state) == TrainedFigure().render(state)


def test_trained_rapid_changes_are_drawn_once(catalogue):
    ui = trained_explorer(experiments.STORE)
    eval_length, bca, plot = part(ui, "attnres-t-eval"), part(ui, "attnres-t-bca"), part(ui, "attnres-trained-plot")
    drawn = ui.drawer.drawn

    async def burst():
        eval_length.value, bca.value, eval_length.value = 4, True, 1
        await past_the_redraw_timer()

    asyncio.run(burst())
    assert ui.drawer.drawn == drawn + 1
    last = trained_state(catalogue, "rope", 0, "mean", "mean", 1, True)
    assert part(ui, "attnres-trained-readout").value == trained_readout_html(last)
    assert bytes(plot.value) == TrainedFigure().render(last)


def test_a_burst_that_ends_on_the_picture_shown_changes_no_byte(catalogue):
    """Layer 0 then layer 1 within the redraw delay, while layer 1 is shown: one draw, of the picture already
    there, so the image's bytes never change (and ipywidgets sends nothing). Hence a browser test cannot wait
    for "the picture changed": it waits for the picture of the view it expects (tests/browser)."""
    ui = trained_explorer(experiments.STORE)
    layer, plot = part(ui, "attnres-t-layer"), part(ui, "attnres-trained-plot")
    layer.value = 1
    shown, drawn, changes = bytes(plot.value), ui.drawer.drawn, []
    assert shown == TrainedFigure().render(trained_state(catalogue, "rope", 0, 1, "mean", 2))
    plot.observe(changes.append, names="value")  # a change is what ipywidgets sends to the page

    async def burst():
        layer.value = 0
        layer.value = 1
        await past_the_redraw_timer()

    asyncio.run(burst())
    assert ui.drawer.drawn == drawn + 1 and bytes(plot.value) == shown and changes == []
    layer.value = 0
    assert bytes(plot.value) == TrainedFigure().render(trained_state(catalogue, "rope", 0, 0, "mean", 2)) != shown


# --------------------------------------------------------------------------- the trained explorer on other stores


def tiny_store(path, runs: dict, L: int = 8, lengths=(8, 16), layers: int = 2, heads: int = 2):
    """A store of runs ``{name: metadata beyond train_len}`` at ``lengths``, causal, random ŝ, NLL 1."""
    g = torch.Generator().manual_seed(0)
    profiles = [
        Profile(run, {"train_len": L, **meta}, T, False, torch.randn(layers, heads, T, generator=g), torch.ones(T))
        for run, meta in runs.items()
        for T in lengths
    ]
    save_profiles(path, profiles)
    return path


PRETRAINED_CONFIG = {"num_hidden_layers": 2, "rope_parameters": {"rope_theta": 1e4}}  # as measure-hf --store keeps


def test_trained_explorer_shows_a_pretrained_models_store_by_its_run(tmp_path):
    """A measure-hf store's ``config`` is the model's configuration (a JSON object), not a setting label:
    each run is its own setting, and R is the store's record."""
    path = tiny_store(
        tmp_path / "hf.safetensors", {"smol": {"encoding": "rope", "seed": 0, "config": PRETRAINED_CONFIG}}
    )
    catalogue = trained_catalogue(path)
    assert catalogue["settings"] == {"rope": ["smol"]} and catalogue["eval_multiples"] == [1, 2]
    state = trained_state(catalogue, "rope", 0, "mean", "mean", 2, False)
    rec = next(r for r in store_records(load_profiles(path)[0]) if r["eval_len"] == 16 and r["layer"] == "mean")
    assert state["R"][rec["head_mode"], "zero"] == pytest.approx(rec["resolution"], rel=1e-12)
    assert "<b>rope · smol, seed 0</b>" in trained_readout_html(state)
    ui = trained_explorer(path)
    assert part(ui, "attnres-error").layout.display == "none"
    assert bytes(part(ui, "attnres-trained-plot").value).startswith(PNG)


def test_the_shipped_pretrained_store_is_shown_without_a_head_to_choose():
    """SmolLM2's store (heads averaged at measurement, 30 layers, T = L and 2L): no head menu, no legend
    over the panel (the title counts the layers), and minor perplexity labels only over a narrow range."""
    catalogue = trained_catalogue(STORES["pretrained"])
    assert catalogue["heads"] == 0 and catalogue["eval_multiples"] == [1, 2] and catalogue["layers"] == 30
    with pytest.raises(ValueError, match=r"head must be one of \['mean'\], got 0"):
        trained_state(catalogue, "rope", 0, head=0)
    figure = TrainedFigure()
    figure.render(trained_state(catalogue, "rope", 0, eval_multiple=2))
    assert figure.legend is None and figure.ax_s.get_title() == "ŝ[n], heads averaged, 30 layers"
    assert isinstance(figure.ax_p.yaxis.get_minor_formatter(), NullFormatter)
    figure.render(trained_state(catalogue, "rope", 0, layer=3, eval_multiple=2))
    assert [t.get_text() for t in figure.legend.get_texts()] == ["layer 3"]


@pytest.mark.parametrize(
    "meta, message",
    [
        ({"encoding": ["rope"], "seed": 0}, r"run 'a': encoding must be an encoding's name, got \['rope'\]"),
        ({"encoding": 3, "seed": 0}, "run 'a': encoding must be an encoding's name, got 3"),
        ({"encoding": "rope", "seed": 0, "config": 5}, "run 'a': config must be a setting's name"),
    ],
)
def test_trained_explorer_refuses_a_bad_encoding_or_config_naming_store_and_run(tmp_path, meta, message):
    path = tiny_store(tmp_path / "bad.safetensors", {"a": meta})
    with pytest.raises(ValueError, match=rf"^store {re.escape(str(path))}: {message}"):
        trained_explorer(path)


def test_trained_explorer_refuses_a_store_with_no_eval_length_a_multiple_of_L(tmp_path):
    """Gemma's store: L = 32768 above every eval length (here L = 64, T = 8 and 16)."""
    path = tiny_store(tmp_path / "long.safetensors", {"a": {"encoding": "rope", "seed": 0}}, L=64)
    with pytest.raises(ValueError, match=r"no eval length is a multiple of the training length L = 64 \(eval lengths"):
        trained_explorer(path)


def test_trained_explorer_refuses_two_runs_of_one_setting_and_seed(tmp_path):
    """Two runs of one setting and seed would overwrite each other in the index: refused, both named."""
    runs = {
        "a": {"encoding": "rope", "seed": 0, "config": "base 100"},
        "b": {"encoding": "rope", "seed": 0, "config": "base 100"},
    }
    path = tiny_store(tmp_path / "twins.safetensors", runs)
    with pytest.raises(ValueError, match="runs 'a' and 'b' are both setting 'base 100', seed 0"):
        trained_catalogue(path)


def test_trained_explorer_on_the_configurations_store_says_what_reads_it():
    """Issue 44 #12: it said the shipped configurations store was "corrupt or not a store ('attnres')"."""
    path = STORES["configurations"]
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} is a configurations store .*notebook 08 reads it$"):
        trained_catalogue(path)


def test_a_store_with_heads_averaged_past_a_length_is_shown_with_the_head_mean(tmp_path):
    """Issue 44 #13: `measure-hf --train-len 2048 --lengths 1,2` keeps every head at L (--per-head-up-to 2048)
    and only their mean at 2L, so one store holds (layers, heads) and (layers, 1): the trained explorer
    refused it. It shows it with the head mean at every length (no head to choose), R the store's record."""
    meta = {"encoding": "rope", "seed": 0, "config": PRETRAINED_CONFIG, "heads_averaged": [16]}
    g = torch.Generator().manual_seed(0)
    profiles = [
        Profile("smol", {"train_len": 8, **meta}, T, False, torch.randn(2, 3 if T == 8 else 1, T, generator=g), nll)
        for T, nll in ((8, torch.ones(8)), (16, torch.ones(16)))
    ]
    path = tmp_path / "mixed.safetensors"
    save_profiles(path, profiles)
    catalogue = trained_catalogue(path)
    assert catalogue["heads"] == 0 and catalogue["layers"] == 2 and catalogue["eval_multiples"] == [1, 2]
    checked = 0
    for boundary in BOUNDARIES:
        for rec in store_records(load_profiles(path)[0], boundary=boundary):
            if rec["layer"] == "upper":
                continue
            state = trained_state(catalogue, "rope", 0, rec["layer"], "mean", rec["eval_len"] // 8, False)
            assert state["R"][rec["head_mode"], boundary] == pytest.approx(rec["resolution"], rel=1e-12, abs=1e-15)
            checked += 1
    assert checked > 8
    ui = trained_explorer(path)
    assert part(ui, "attnres-error").layout.display == "none"
    assert bytes(part(ui, "attnres-trained-plot").value).startswith(PNG)
    deeper = Profile("smol", profiles[1].meta, 16, False, torch.zeros(3, 1, 16), torch.ones(16))
    save_profiles(path, [profiles[0], deeper])  # 2 layers at L, 3 at 2L: still refused
    with pytest.raises(ValueError, match=r"one \(layers, heads\) shape, got .* shapes \[\(2, 3\), \(3, 1\)\]"):
        trained_catalogue(path)
