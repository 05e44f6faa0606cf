"""The notebook figures of attnres_helpers.plots: what they draw, and that they stay legible at
JupyterLab's display width (at most DISPLAY_WIDTH inches at dpi 100, no text below MIN_FONT pt)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attnres_helpers import store  # noqa: E402
from attnres_helpers.metric import resolution  # noqa: E402
from attnres_helpers.plots import (  # noqa: E402
    DISPLAY_WIDTH,
    MIN_FONT,
    layer_resolution_figure,
    layer_weights_figure,
    plot_layer_softmax,
    plot_mask,
    plot_measured_profiles,
    plot_stat_bars,
    plot_training_losses,
    save_png_atomic,
)
from attnres_helpers.store import Profile  # noqa: E402
from attnres_helpers.store import records as store_records
from attnres_helpers.tables import layer_table  # noqa: E402

L = 16


def _profiles():
    """Two encodings × two seeds, 3 layers, 2 heads, at L and 2L: a geometric decay per layer whose
    slope differs by encoding, layer and seed; 'flat' has nearly flat upper layers (tiny R)."""
    out = []
    for encoding, base in (("steep", 1.0), ("flat", 0.02)):
        for seed in (0, 1):
            meta = {"encoding": encoding, "seed": seed, "train_len": L}
            for k in (1, 2):
                T = k * L
                slopes = torch.tensor([2.0, base * (1 + seed), base * (2 + seed)], dtype=torch.float64)  # (layers,)
                s_hat = -(slopes[:, None, None] * torch.arange(T, dtype=torch.float64)).expand(3, 2, T)
                out.append(
                    Profile(
                        f"{encoding}-s{seed}",
                        meta,
                        T,
                        False,
                        s_hat.float().clone(),
                        torch.full((T,), 1.5, dtype=torch.float64),
                    )
                )
    return out


def _texts(fig):
    """Every visible text of a figure: titles, labels, tick labels, legends."""
    fig.canvas.draw()
    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]


def _assert_legible(fig):
    width, _ = fig.get_size_inches()
    assert width <= DISPLAY_WIDTH + 1e-9
    small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < MIN_FONT]
    assert not small, small


def test_layer_resolution_figure_is_legible_log_scaled_and_draws_the_reference_column():
    records = store_records(_profiles())
    fig = layer_resolution_figure(
        records, ["steep", "flat"], columns=("R(L)", "R(2L)"), reference="steep", ncols=3, reference_column="R(L)"
    )
    _assert_legible(fig)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["steep", "flat"]
    assert all(ax.get_yscale() == "log" for ax in visible)
    # The axis starts below the smallest seed value, so every bar is visible.
    values = [
        v
        for e in ("steep", "flat")
        for row in layer_table(records, e)
        for c in ("R(L)", "R(2L)")
        for v in row[c].values
    ]
    assert visible[0].get_ylim()[0] < min(values)
    # The reference step line: the 'steep' per-layer R(L) means, drawn in the other panel only.
    level = [row["R(L)"].mean for row in layer_table(records, "steep")]
    steps = [line for line in visible[1].lines if line.get_linestyle() == ":"]
    assert len(steps) == 1 and np.allclose(steps[0].get_ydata()[:-1], level)
    assert not [line for line in visible[0].lines if line.get_linestyle() == ":"]
    # The legend sits in the free third panel: a figure legend naming the columns and the reference.
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels == ["R(L)", "R(2L)", "one seed", "min–max over seeds", "steep R(L)"]
    plt.close(fig)


def test_range_error_bars_span_the_seeds_and_stay_positive():
    records = store_records(_profiles())
    rows = layer_table(records, "flat")
    fig, ax = plt.subplots()
    plot_stat_bars(rows, ["R(L)"], category="layer", ax=ax, errors="range")
    (container,) = [c for c in ax.containers if hasattr(c, "errorbar") and c.errorbar is not None]
    segments = container.errorbar.lines[2][0].get_segments()
    for segment, row in zip(segments, rows):
        low, high = sorted(segment[:, 1])
        assert low == pytest.approx(min(row["R(L)"].values)) and high == pytest.approx(max(row["R(L)"].values))
        assert low > 0
    with pytest.raises(ValueError, match="errors"):
        plot_stat_bars(rows, ["R(L)"], category="layer", ax=ax, errors="sem")
    plt.close(fig)


def test_layer_weights_figure_shows_the_softmax_weights_and_their_R():
    profile = _profiles()[1]  # steep, seed 0, T = 2L
    fig = layer_weights_figure({"steep": profile.s_hat, "again": profile.s_hat}, L)
    _assert_legible(fig)
    assert len(fig.axes) == 4
    ax_s, ax_p = fig.axes[:2]
    assert ax_p.get_yscale() == "log"
    for layer, line in enumerate(ax_p.lines[:3]):
        s = profile.s_hat[layer].double().mean(0).numpy()
        p = np.exp(s - np.logaddexp.reduce(s))
        assert np.allclose(line.get_ydata(), p)
        assert f"R = {float(resolution(s)):.3g}" in line.get_label()
    assert np.allclose(ax_s.lines[0].get_ydata(), profile.s_hat[0].double().mean(0).numpy())
    plt.close(fig)


def test_training_losses_are_centred_running_means():
    fig, ax = plt.subplots(figsize=(DISPLAY_WIDTH, 3))
    plot_training_losses({"a": [np.arange(10.0), np.arange(10.0) + 1], "b": [np.ones(10)]}, ax=ax, smooth=3)
    _assert_legible(fig)
    assert len(ax.lines) == 3
    x, y = ax.lines[0].get_data()
    assert np.allclose(x, np.arange(1, 9)) and np.allclose(y, np.arange(1, 9))  # mean of 3 consecutive steps
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    with pytest.raises(ValueError, match="smooth"):
        plot_training_losses({"a": [np.ones(4)]}, ax=ax, smooth=0)
    plt.close(fig)


def test_position_perplexity_is_legible_with_plain_tick_labels():
    from attnres_helpers.plots import plot_position_perplexity

    fig, ax = plt.subplots(figsize=(DISPLAY_WIDTH, 3.6))
    plot_position_perplexity({"a": np.log(np.linspace(3, 60, 4 * L)), "b": np.full(4 * L, np.log(4.0))}, L, ax=ax)
    _assert_legible(fig)
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and not any("times" in label or "^" in label for label in labels)  # 40, not 4×10¹
    plt.close(fig)


def _family_points(n_settings=21):
    from attnres_helpers.analysis import Point

    rng = np.random.default_rng(0)
    families = ["rope", "xpos", "alibi", "sinusoidal", "nope"]
    points = []
    for i in range(n_settings):
        for bca in (False, True):
            x = float(rng.random())
            y = float(i)  # twins tie in the outcome: pairs of points share a row
            points.append(
                Point(
                    f"rope base {100 * (i + 1)}",
                    families[i % 5],
                    bca,
                    {"R(2L) upper": x, "rise 2L": y},
                    {"R(2L) upper": {0: x}, "rise 2L": {0: y}},
                )
            )
    return points


def test_rank_rank_labels_do_not_overlap_and_ranks_are_plotted():
    from attnres_helpers.family_plots import rank_rank_figure
    from attnres_helpers.stats import average_ranks

    points = _family_points()
    fig = rank_rank_figure(points, "R(2L) upper", "rise 2L")
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == len(points)
    overlaps = [(i, j) for i in range(len(boxes)) for j in range(i) if boxes[i].overlaps(boxes[j])]
    assert overlaps == []
    xs = sorted(line.get_xdata()[0] for line in ax.lines)
    expected = sorted(average_ranks([p.values["R(2L) upper"] for p in points]))
    np.testing.assert_allclose(xs, expected)
    assert fig.get_size_inches()[0] <= DISPLAY_WIDTH
    assert min(t.get_fontsize() for t in ax.texts) >= MIN_FONT
    plt.close(fig)


# --- R from the store's query; heads averaged as R averages them -------------------------------------


def test_layer_softmax_takes_R_from_the_store_query(monkeypatch):
    profile = _profiles()[1]
    calls = []

    def fake(self, head_mode="mean-scores", boundary="zero", temperature=1.0, sink=True):
        calls.append((head_mode, boundary, sink))
        return torch.tensor([0.125, 0.25, 0.5], dtype=torch.float64)

    monkeypatch.setattr(store.Profile, "layer_resolutions", fake)
    for given in (profile, profile.s_hat, profile.s_hat.numpy()):  # a stored Profile, or its ŝ
        fig, ax = plt.subplots()
        plot_layer_softmax(given, L, ax=ax, boundary="drop")
        assert [line.get_label() for line in ax.lines[:3]] == [
            "layer 0: R = 0.125",
            "layer 1: R = 0.25",
            "layer 2: R = 0.5",
        ]
        plt.close(fig)
    assert calls == [("mean-scores", "drop", True)] * 3


def test_heads_are_averaged_over_the_heads_that_see_a_distance():
    # Head 1 is masked (-inf) at distance 3 only: the mean there is head 0's score (as mean-scores R
    # takes it), not -inf (a gap), and the weights and R in the legend agree with the store's query.
    T = 2 * L
    s_hat = np.tile(-np.arange(T, dtype=float) / 4, (1, 2, 1))
    s_hat[0, 1] -= 1.0
    s_hat[0, 1, 3] = -np.inf
    fig, (left, right) = plt.subplots(1, 2)
    plot_measured_profiles({"T = 2L": s_hat}, L, ax=left)
    assert left.lines[0].get_ydata()[3] == pytest.approx(-3 / 4) and np.isfinite(left.lines[0].get_ydata()).all()
    plot_layer_softmax(s_hat, L, ax=right)
    mean = np.r_[(s_hat[0, 0, :3] + s_hat[0, 1, :3]) / 2, s_hat[0, 0, 3], (s_hat[0, 0, 4:] + s_hat[0, 1, 4:]) / 2]
    assert np.allclose(right.lines[0].get_ydata(), np.exp(mean - np.logaddexp.reduce(mean)), rtol=1e-12, atol=0)
    assert right.lines[0].get_label() == f"layer 0: R = {float(resolution(mean)):.3g}"
    plt.close(fig)


# --- figures written deterministically -------------------------------------------------------------


def _figure():
    fig = layer_resolution_figure(
        store_records(_profiles()), ["steep", "flat"], columns=("R(L)", "R(2L)"), reference="steep"
    )
    return fig


def test_saved_png_has_the_same_bytes_on_every_write_and_under_any_session_settings(tmp_path):
    from PIL import Image

    fig = _figure()
    first, second = save_png_atomic(fig, tmp_path / "a.png"), save_png_atomic(fig, tmp_path / "b.png")
    assert first.read_bytes() == second.read_bytes()
    with Image.open(first) as image:  # no text chunks: no "Software" version tag, no date
        assert image.format == "PNG" and not {k for k in image.info if k not in ("dpi",)}
        assert image.size == (950, 290)  # DISPLAY_WIDTH × one row of 2.9 inches at dpi 100
    plt.close(fig)
    # A session with other savefig settings, and a figure drawn under a transparent facecolor (as some
    # notebook backends set), give the same bytes as the default session.
    session = {
        "savefig.transparent": True,
        "savefig.bbox": "tight",
        "savefig.facecolor": "red",
        "savefig.pad_inches": 1.0,
        "figure.facecolor": (1, 1, 1, 0),
    }
    with matplotlib.rc_context(session):
        fig = _figure()
        other = save_png_atomic(fig, tmp_path / "c.png")
    plt.close(fig)
    assert other.read_bytes() == first.read_bytes()


def test_mask_panels_label_positions_as_integers():
    """Notebook 04's mask panels (three in a row, T = 16 and 32): ticks only at whole positions (at that size
    matplotlib's default put them at 2.5, 7.5, ...)."""
    from attnres_helpers.model import blockwise_causal_mask

    fig, axes = plt.subplots(1, 3, figsize=(13, 4.3))
    for ax, T in zip(axes, (16, 16, 32)):
        plot_mask(blockwise_causal_mask(T, 4), ax=ax, block=4)
    fig.canvas.draw()
    for ax, T in zip(axes, (16, 16, 32)):
        for ticks in (ax.get_xticks(), ax.get_yticks()):
            shown = [t for t in ticks if -0.5 <= t <= T - 0.5]
            assert shown and all(float(t).is_integer() for t in shown), ticks
    plt.close(fig)
