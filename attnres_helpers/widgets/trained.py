"""The trained-model explorer (notebook 04): stored ŝ and per-position NLL, no model loaded.

:func:`trained_catalogue` indexes a measurement store by setting (the run metadata key
``"config"`` where the store has several settings of one encoding, as the family store does; the run's
name in a pretrained model's store; the encoding's name otherwise), seed, eval length and mask.
:func:`trained_state` is what one choice of controls shows, with every R taken from the store's own query
(:meth:`attnres_helpers.store.Profile.layer_resolutions`, with and without the first-token sink),
and :func:`trained_readout_html` its readout. :func:`trained_explorer` wires the controls.
"""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path

import ipywidgets as widgets
import numpy as np
import torch
from numpy.typing import ArrayLike

from ..metric import BOUNDARIES, HEAD_MODES, mean_over_heads
from ..paths import STORES
from ..store import load_profiles, perplexities
from .render import figure_pane, serialized, state_update
from .text import format_sig
from .trained_figure import TrainedFigure

DEFAULT_STORE = STORES["default"]  # the shipped models of notebooks 03 and 04
NO_BCA_REASON = {
    "sinusoidal": "BCA is disabled for sinusoidal: absolute positions are added once at the input, so there is "
    "no window-relative version, and the store holds no BCA profiles for it (section 1)"
}
LABEL_STYLE = {"description_width": "initial"}  # a control's label is as wide as its text: never cut off
TOGGLE_STYLE = {**LABEL_STYLE, "button_width": "auto"}  # each button as wide as its label
EVAL_MULTIPLES = (1, 2, 4)  # the eval lengths the shipped stores hold, in units of L


def setting_of(meta: dict, run: str) -> str:
    """The trained setting run ``run`` belongs to: its ``"config"`` label where that is a string (the
    family store's), the run's own name where it is a model's configuration (a JSON object: a
    pretrained model's store, :mod:`attnres_helpers.hf.pretrained`), else its encoding."""
    config = meta.get("config")
    if config is None:
        return meta["encoding"]
    if isinstance(config, str):
        return config
    if isinstance(config, dict):
        return run
    raise ValueError(f"config must be a setting's name (a string) or a model's configuration, got {config!r}")


def _index(path, profiles: list) -> tuple[dict, dict, dict]:
    """``(index, seeds, settings)`` of :func:`trained_catalogue`; a run's bad ``encoding`` or ``config``,
    or two runs of one setting and seed, is one error naming the store, the run and the field."""
    index, seeds, settings, runs = {}, {}, {}, {}
    for p in profiles:
        encoding = p.meta["encoding"]
        if not isinstance(encoding, str) or not encoding:
            raise ValueError(f"store {path}: run {p.run!r}: encoding must be an encoding's name, got {encoding!r}")
        try:
            setting = setting_of(p.meta, p.run)
        except ValueError as err:
            raise ValueError(f"store {path}: run {p.run!r}: {err}") from None
        if settings.setdefault(setting, encoding) != encoding:
            raise ValueError(f"store {path}: setting {setting!r} holds runs of {settings[setting]} and {encoding}")
        seed = p.meta["seed"]
        if runs.setdefault((setting, seed), p.run) != p.run:
            raise ValueError(
                f"store {path}: runs {runs[setting, seed]!r} and {p.run!r} are both setting {setting!r}, "
                f"seed {seed}: the trained explorer cannot tell them apart"
            )
        index[setting, seed, p.eval_len, p.bca] = p
        seeds.setdefault(setting, set()).add(seed)
    return index, seeds, settings


def trained_catalogue(store_path: str | Path | None = None) -> dict:
    """The stored measurements indexed for the trained explorer: no model is loaded.

    Returns ``{"path", "index": {(setting, seed, eval_len, bca): Profile}, "encodings",
    "settings": {encoding: [setting, ...]}, "seeds": {setting: [seed, ...]}, "eval_multiples",
    "train_len", "layers", "heads"}`` (:func:`setting_of`: the shipped store's settings are its
    encodings; ``heads`` is 0 where the heads were averaged at measurement, so that there is no head
    to choose). Every run must share one training length and one (layers, heads) shape, since the
    controls offer one set of each (heads averaged past some length, (layers, 1) there: shown with the
    head mean everywhere), and some eval length must be a multiple of it; R and plot ranges
    are cached in it as they are asked for.
    """
    path = DEFAULT_STORE if store_path is None else store_path
    profiles, _ = load_profiles(path)
    index, seeds, settings = _index(path, profiles)
    train_lens = {p.meta["train_len"] for p in profiles}
    # heads averaged at measurement past some length (measure-hf's --per-head-up-to) hold (layers, 1) beside
    # the (layers, heads) of the lengths that kept them: such a store is shown with the head mean everywhere
    kept = {tuple(p.s_hat.shape[:2]) for p in profiles if not p.heads_averaged}
    depths = {p.s_hat.shape[0] for p in profiles}
    if len(train_lens) != 1 or len(kept) > 1 or len(depths) != 1:
        shapes = sorted({tuple(p.s_hat.shape[:2]) for p in profiles})
        raise ValueError(
            f"store {path}: the trained explorer needs one training length and one (layers, heads) shape, "
            f"got training lengths {sorted(train_lens)} and shapes {shapes}"
        )
    layers, heads = depths.pop(), kept.pop()[1] if kept else 1
    L = train_lens.pop()
    multiples = sorted({p.eval_len // L for p in profiles if p.eval_len % L == 0})
    if not multiples:
        raise ValueError(
            f"store {path}: no eval length is a multiple of the training length L = {L} (eval lengths "
            f"{sorted({p.eval_len for p in profiles})}), and the trained explorer shows T = kL"
        )
    encodings = list(dict.fromkeys(p.meta["encoding"] for p in profiles))
    return {
        "path": str(path),
        "index": index,
        "encodings": encodings,
        "settings": {e: [s for s, enc in settings.items() if enc == e] for e in encodings},
        "seeds": {s: sorted(v) for s, v in seeds.items()},
        "eval_multiples": multiples,
        "train_len": L,
        "layers": layers,
        "heads": 0 if any(p.heads_averaged for p in profiles) else heads,
        "cache": {},
    }


def _one_of(value, options, what: str):
    if isinstance(value, bool) or value not in options:
        raise ValueError(f"{what} must be one of {list(options)}, got {value!r}")
    return value


def _choose_setting(catalogue: dict, encoding: str, setting) -> str:
    settings = catalogue["settings"][encoding]
    if setting is None:
        if len(settings) > 1:
            raise ValueError(
                f"this store holds {len(settings)} settings of {encoding}: choose one with setting=, one of {settings}"
            )
        return settings[0]
    return _one_of(setting, settings, f"setting (for {encoding})")


def _head_profile(profile, head):
    """The profile itself for ``head="mean"``, else the same measurement restricted to one head."""
    if head == "mean":
        return profile
    one = slice(head, head + 1)
    return dataclasses.replace(
        profile, s_hat=profile.s_hat[:, one], key0=None if profile.key0 is None else profile.key0[:, one]
    )


def _cached_resolutions(catalogue: dict, profile, head) -> dict:
    """``{(head_mode, boundary, sink): per-layer R or None}`` from the store's query, cached per profile and head."""
    key = ("R", profile.key, head)
    if key not in catalogue["cache"]:
        chosen = _head_profile(profile, head)
        catalogue["cache"][key] = {
            (mode, boundary, sink): None
            if mode == "mean-R" and chosen.heads_averaged
            else chosen.layer_resolutions(mode, boundary, sink=sink)
            for mode in HEAD_MODES
            for boundary in BOUNDARIES
            for sink in (True, False)
        }
    return catalogue["cache"][key]


def _curves(profile, layers: list[int], head) -> tuple[np.ndarray, np.ndarray]:
    """(scores, weights), each ``(l, T)``: ŝ of the chosen layers with heads combined by the mean over
    heads (masked distances stay -inf), and their softmax weights p_n."""
    s_hat = profile.s_hat.double()  # (layers, H, T)
    chosen = s_hat if head == "mean" else s_hat[:, head : head + 1, :]  # (layers, h, T)
    scores = mean_over_heads(chosen[layers])  # (l, T)
    return scores.numpy(), torch.softmax(scores, dim=-1).numpy()


DRAWN_LOG_PERPLEXITY_MAX = 690.0  # e^690 ~ 1e299: the axis limits (x 1.1) stay finite


def drawn_perplexity(nll: ArrayLike | torch.Tensor) -> np.ndarray:
    """Per-position perplexity exp(NLL) ``(T,)`` as the figure draws it: at most e^690, so that a model
    whose NLL passes exp's range still draws (at the ceiling; the readout gives such a perplexity as inf)."""
    return np.exp(np.minimum(np.asarray(nll, dtype=np.float64), DRAWN_LOG_PERPLEXITY_MAX))


def plot_limits(catalogue: dict, setting: str, seed: int, layer: int | str, head: int | str) -> dict:
    """The trained figure's fixed ranges for one run, layer and head choice: over every eval length and
    mask the store holds, so that they stay put while only BCA or the length changes.

    ``{"max_len": the longest eval length, "scores": (low, high), "weights": (low, high) (positive, for
    a log axis), "ppl": (low, high)}``.
    """
    key = ("limits", setting, seed, layer, head)
    if key not in catalogue["cache"]:
        layers = list(range(catalogue["layers"])) if layer == "mean" else [layer]
        runs = [p for (s, sd, _, _), p in catalogue["index"].items() if (s, sd) == (setting, seed)]
        scores, weights, ppl = [], [], []
        for profile in runs:
            s, w = _curves(profile, layers, head)
            scores.append(s[np.isfinite(s)])
            weights.append(w[w > 0])
            ppl.append(drawn_perplexity(profile.nll))
        scores, weights, ppl = (np.concatenate(v) for v in (scores, weights, ppl))
        pad = 0.05 * float(np.ptp(scores)) or 1.0
        catalogue["cache"][key] = {
            "max_len": max(p.eval_len for p in runs),
            "scores": (float(scores.min()) - pad, float(scores.max()) + pad),
            "weights": (float(weights.min()) / 2, min(2.0, float(weights.max()) * 2)),
            "ppl": (float(ppl.min()) / 1.1, float(ppl.max()) * 1.1),
        }
    return catalogue["cache"][key]


def trained_state(
    catalogue: dict,
    encoding: str,
    seed: int,
    layer: int | str = "mean",
    head: int | str = "mean",
    eval_multiple: int = 1,
    bca: bool = False,
    setting: str | None = None,
) -> dict:
    """What the trained explorer shows for one choice of controls, from stored ŝ and NLL only.

    ``layer`` and ``head`` are indices or ``"mean"``; ``setting`` is needed only where the store
    holds several settings of the encoding (:func:`trained_catalogue`). Returns the profile chosen,
    its layers' scores ``scores (l, T)`` (heads combined by the mean over heads, masked distances
    as -inf; l = every layer for ``layer="mean"``), the softmax weights ``weights (l, T)``, the
    per-position perplexity ``ppl (T,)`` = exp(NLL), the perplexities before and past L, the fixed
    plot ranges ``limits`` (:func:`plot_limits`), ``R``: ``{(head_mode, boundary): R}`` for every
    head convention and boundary, and ``R_sink_free``: the same without the first-token sink (None
    where the store has no key-0 scores). Both are exactly what
    :func:`attnres_helpers.store.records` reports for that run, eval length, mask and layer
    (``"mean"``: the mean of the per-layer R, as in Table 3). For one head, R is that head's R
    under both conventions (there is nothing to average).
    """
    encoding = _one_of(encoding, catalogue["encodings"], "encoding")
    setting = _choose_setting(catalogue, encoding, setting)
    seed = _one_of(seed, catalogue["seeds"][setting], f"seed (for {setting})")
    layer = _one_of(layer, ["mean", *range(catalogue["layers"])], "layer")
    head = _one_of(head, ["mean", *range(catalogue["heads"])], "head")
    eval_multiple = _one_of(eval_multiple, catalogue["eval_multiples"], "eval_multiple (eval length in units of L)")
    if not isinstance(bca, bool):
        raise ValueError(f"bca must be True or False, got {bca!r}")
    L = catalogue["train_len"]
    key = (setting, seed, eval_multiple * L, bca)
    if key not in catalogue["index"]:
        reason = NO_BCA_REASON.get(encoding, "") if bca else ""
        raise ValueError(
            f"the store holds no profile for {setting}, seed {seed}, eval length {eval_multiple}L = "
            f"{eval_multiple * L}, {'BCA' if bca else 'causal'}" + (f" ({reason})" if reason else "")
        )
    profile = catalogue["index"][key]
    per_layer = _cached_resolutions(catalogue, profile, head)

    def pick(values: torch.Tensor | None) -> float | None:
        if values is None:
            return None
        return float(values.mean()) if layer == "mean" else float(values[layer])

    R = {(mode, b): pick(per_layer[mode, b, True]) for mode in HEAD_MODES for b in BOUNDARIES}
    R_sink_free = {(mode, b): pick(per_layer[mode, b, False]) for mode in HEAD_MODES for b in BOUNDARIES}
    layers = list(range(catalogue["layers"])) if layer == "mean" else [layer]
    scores, weights = _curves(profile, layers, head)
    return {
        "run": profile.run,
        "encoding": encoding,
        "setting": setting,
        "seed": seed,
        "layer": layer,
        "head": head,
        "layers": layers,
        "n_layers": catalogue["layers"],
        "train_len": L,
        "eval_len": profile.eval_len,
        "eval_multiple": eval_multiple,
        "bca": bca,
        "scores": scores,
        "weights": weights,
        "ppl": drawn_perplexity(profile.nll),
        **perplexities(profile.nll, L),
        "limits": plot_limits(catalogue, setting, seed, layer, head),
        "R": R,
        "R_sink_free": R_sink_free,
    }


def trained_readout_html(state: dict) -> str:
    """The trained explorer's readout: the configuration, R under both head conventions and both
    boundaries, with and without the first-token sink (3 significant figures; "n/a" where the
    store has no key-0 scores), and perplexity before and past L in the same windows."""
    k = state["eval_multiple"]
    T = f"T = {'' if k == 1 else k}L = {state['eval_len']}"
    layer = "layer mean" if state["layer"] == "mean" else f"layer {state['layer']}"
    head = "heads: convention below" if state["head"] == "mean" else f"head {state['head']}"
    setting = "" if state["setting"] == state["encoding"] else f" · {html.escape(state['setting'])}"
    cell = "style='padding:0 10px; text-align:right'"
    columns = [(R, b) for R in ("R", "R_sink_free") for b in BOUNDARIES]
    headers = [f"boundary {b}" if R == "R" else f"{b}, no sink" for R, b in columns]
    rows = "".join(
        f"<tr><td style='padding:0 10px'>{mode}</td>"
        + "".join(f"<td {cell}>{format_sig(state[R][mode, b])}</td>" for R, b in columns)
        + "</tr>"
        for mode in HEAD_MODES
    )
    one_head = "<br><i>one head: both conventions give this head's R</i>" if state["head"] != "mean" else ""
    no_key0 = all(v is None for v in state["R_sink_free"].values())
    sink = (
        "<i>no sink: R of ŝ without the first-token entries (n, 0), the store's query"
        + (" (n/a: this store has no key-0 scores)" if no_key0 else "")
        + "</i><br>"
    )
    past = state["perplexity_past_L"]
    ppl = f"perplexity: positions &lt; L {format_sig(state['perplexity_first_L'])}" + (
        f" · positions ≥ L {format_sig(past)}" if past is not None else " · (no positions ≥ L at T = L)"
    )
    return (
        f"<b>{html.escape(state['encoding'])}{setting}, seed {state['seed']}</b> · {layer} · {head} · {T} · "
        f"{'BCA' if state['bca'] else 'causal'}"
        f"<table style='margin:2px 0'><tr><th style='padding:0 10px; text-align:left'>R</th>"
        + "".join(f"<th {cell}>{h}</th>" for h in headers)
        + f"</tr>{rows}</table>"
        f"{sink}{ppl}{one_head}"
    )


def trained_explorer(store_path: str | Path | None = None) -> widgets.VBox:
    """Explore the stored ŝ and per-position NLL of trained models (notebook 04); no model is loaded.

    Controls: encoding, setting (where the store holds several of the encoding, e.g. the family's
    RoPE bases; disabled otherwise), seed, layer (or mean), head (or mean), eval length and BCA
    (disabled, with its reason, where the store has no BCA profiles: sinusoidal). The readout
    (class ``attnres-trained-readout``) gives R under both head conventions and both boundaries,
    with and without the first-token sink, from :func:`trained_state`. The plot's axes stay fixed
    while only BCA or the length changes, and it draws the last of a burst of changes
    (:class:`LatestWins`); the readout follows every change.
    """
    catalogue = trained_catalogue(store_path)
    L, encodings = catalogue["train_len"], catalogue["encodings"]
    default = "rope" if "rope" in encodings else encodings[0]
    # Short lists are toggle buttons, which the keyboard reaches (Tab, then Space): a drop-down inside JupyterLab
    # lost its arrow keys to the notebook, which moved the active cell. The settings of a family stay a menu.
    encoding = widgets.ToggleButtons(
        options=encodings, value=default, description="encoding", style=TOGGLE_STYLE
    ).add_class("attnres-t-encoding")
    one_each = all(catalogue["settings"][e] == [e] for e in encodings)  # the settings are the encodings: no menu
    setting = widgets.Dropdown(
        options=catalogue["settings"][default],
        description="setting",
        style=LABEL_STYLE,
        layout=widgets.Layout(width="330px", display="none" if one_each else None),
    )
    setting.add_class("attnres-t-setting")
    seed = widgets.ToggleButtons(
        options=catalogue["seeds"][setting.value], description="seed", style=TOGGLE_STYLE
    ).add_class("attnres-t-seed")
    layer = widgets.ToggleButtons(
        options=[("mean", "mean")] + [(str(i), i) for i in range(catalogue["layers"])],
        value="mean",
        description="layer",
        style=TOGGLE_STYLE,
    ).add_class("attnres-t-layer")
    head = widgets.ToggleButtons(
        options=[("mean", "mean")] + [(str(i), i) for i in range(catalogue["heads"])],
        value="mean",
        description="head",
        style=TOGGLE_STYLE,
    ).add_class("attnres-t-head")
    multiples = catalogue["eval_multiples"]
    eval_multiple = widgets.ToggleButtons(
        options=[(f"{'' if k == 1 else k}L = {k * L}", k) for k in multiples],
        value=2 if 2 in multiples else multiples[0],
        description="eval length",
        style=LABEL_STYLE,
    ).add_class("attnres-t-eval")
    bca = widgets.Checkbox(
        value=False, description="BCA (blockwise causal attention)", indent=False, style=LABEL_STYLE
    ).add_class("attnres-t-bca")
    bca_note = widgets.HTML().add_class("attnres-t-bca-note")
    readout = widgets.HTML().add_class("attnres-trained-readout")
    error, figure, plot, show_error, drawer = figure_pane(TrainedFigure, "attnres-trained-plot")
    holding = []
    update = state_update(
        lambda: trained_state(
            catalogue,
            encoding.value,
            seed.value,
            layer.value,
            head.value,
            eval_multiple.value,
            bca.value,
            setting.value,
        ),
        readout,
        trained_readout_html,
        show_error,
        drawer,
        holding,
    )

    def choose(dropdown: widgets.Dropdown | widgets.ToggleButtons, options: list) -> None:
        """New options for a menu or toggle buttons, keeping its value where it is still one of them."""
        value = dropdown.value if dropdown.value in options else options[0]
        dropdown.options = options
        dropdown.value = value

    @serialized
    def switch_setting(_: dict | None = None) -> None:
        holding.append(True)
        try:
            choose(seed, catalogue["seeds"][setting.value])
        finally:
            holding.pop()
        update()

    @serialized
    def switch_encoding(_: dict | None = None, at_once: bool = False) -> None:
        holding.append(True)
        try:
            settings = catalogue["settings"][encoding.value]
            choose(setting, settings)
            setting.disabled = len(settings) == 1
            choose(seed, catalogue["seeds"][setting.value])
            has_bca = any(key[0] in settings and key[3] for key in catalogue["index"])
            reason = (
                None
                if has_bca
                else NO_BCA_REASON.get(encoding.value, f"the store holds no BCA profiles for {encoding.value}")
            )
            if reason:
                bca.value = False
            bca.disabled = reason is not None
            bca_note.value = f"<i>{html.escape(reason, quote=False)}</i>" if reason else ""
        finally:
            holding.pop()
        update(at_once=at_once)

    encoding.observe(switch_encoding, names="value")
    setting.observe(switch_setting, names="value")
    for control in (seed, layer, head, eval_multiple, bca):
        control.observe(update, names="value")
    switch_encoding(at_once=True)
    controls = widgets.VBox(
        [
            widgets.HBox([encoding, setting, seed]),
            widgets.HBox([layer, head]),
            eval_multiple,
            widgets.HBox([bca, bca_note]),
        ]
    )
    root = widgets.VBox([controls, readout, error, plot]).add_class("attnres-trained-explorer")
    root.drawer = drawer  # how many plots were drawn (``drawn``), for tests and the benchmark
    return root
