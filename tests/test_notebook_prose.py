"""Phrases a reading group found going further than the data, or written for insiders: once removed, they
stay out."""

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
REMOVED = {
    "means a very local pattern": "R near 0.9 says the weight sits on one distance, which need not be near",
    "the order of the paper's Table 3": "SmolLM2's R at L is about half of Table 3's values",
    "interim until the family is complete": "plan v2's family is complete",
    "as notebook 05's family (400 steps": "400 steps was plan v1's family; plan v2's trains for 1600",
    "it carries $R$ (notebook 06)": "the pretrained model is in notebook 07",
    "seed card": "insider wording: say what the claim is, not which card made it",
    "design card": "insider wording: say what the claim is, not which card made it",
    "Small is not the same as uninformative": "the copy gains carry little signal: notebook 05 prints how little",
    "The probe is one retrieval task": "a copy probe intended as a retrieval outcome, which these models do not pass",
    "The copy probe: retrieval past L": "a copy probe intended as a retrieval outcome, which these models do not pass",
    "Answer to check against": "an exercise does not give its answer in the question",
    "Solution (click to expand)": "answers are folded outputs (attnres_helpers.notebook.folded_answer)",
    "uses more text to predict better": "the NLL falls over the first ~2k positions and is flat after",
    "lent to one session": "insider wording: say what was trained and where, not how the machine was got",
    "no GPU was lent": "insider wording: say what was trained and where, not how the machine was got",
    "R at 2L is not one measure of extrapolation": "the copy probe may not measure retrieval at this scale",
}
TEXTS = sorted(ROOT.glob("notebooks/*.ipynb")) + [ROOT / "README.md"]


def prose(path: Path) -> str:
    if path.suffix == ".md":
        return path.read_text()
    cells = nbformat.read(path, 4).cells
    markdown = [c.source for c in cells if c.cell_type == "markdown"]
    shown = [  # prose that code builds: the Markdown a cell displays
        "".join(o["data"]["text/markdown"])
        for c in cells
        if c.cell_type == "code"
        for o in c.outputs
        if "text/markdown" in o.get("data", {})
    ]
    return "\n".join(markdown + shown)


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_removed_phrases_stay_out(path):
    text = prose(path)
    found = {phrase: why for phrase, why in REMOVED.items() if phrase in text}
    assert not found, f"{path.name}: {found}"
