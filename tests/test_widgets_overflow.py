"""The trained explorer (attnres_helpers.widgets) on a store whose NLL is past exp's range: the readout says
inf and the figure draws at its ceiling. Kept apart from tests/test_widgets.py; it reads the tiny family's
store (conftest's ``family``)."""

import torch

from attnres_helpers.store import load_profiles, save_profiles


def test_the_trained_explorer_draws_nll_past_exps_range(family, tmp_path):
    """NLL above 709: the readout says inf, the figure draws at its ceiling (finite axis limits), no warning."""
    import dataclasses
    import warnings

    from attnres_helpers.widgets import find_by_class, trained_explorer

    profiles, about = load_profiles(family.store)
    huge = [dataclasses.replace(p, nll=torch.full_like(p.nll, 710.0)) for p in profiles]
    path = tmp_path / "huge.safetensors"
    save_profiles(path, huge, about)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow in exp would be one
        ui = trained_explorer(path)
        find_by_class(ui, "attnres-t-bca").value = True  # a second drawing
    assert find_by_class(ui, "attnres-error").value == ""
    assert "positions &lt; L inf · positions ≥ L inf" in find_by_class(ui, "attnres-trained-readout").value
