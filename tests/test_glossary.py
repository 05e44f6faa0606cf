"""GLOSSARY.md: every term it defines is linked there, from each notebook's markdown and the README, no later
than the cell (the README: the line) of the term's first use; every entry names the notebook that
introduces it, and that notebook uses the term."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "GLOSSARY.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# How each entry (by its anchor) is written in prose: the forms a reader meets.
TERMS = {
    "alibi": r"\bALiBi\b",
    "attention-interface": r"AttentionInterface|attention interface",
    "bca": r"\bBCA\b|[Bb]lockwise causal attention",
    "bos": r"\bBOS\b",
    "copy-probe": r"\b[Cc]opy probe",
    "dequantised": r"\b[Dd]equantis",
    "exact-permutation-p": r"\bexact permutation|\bexact p\b",
    "gguf": r"\bGGUF\b|\bQ4_1\b",
    "nats": r"\bnats?\b",
    "nll": r"\bNLL\b",
    "ntk": r"\bNTK\b",
    "passkey": r"\b[Pp]ass ?keys?\b",
    "perplexity": r"\b[Pp]erplexit(?:y|ies)\b",
    "plan": r"\b[Pp]lan v\d",
    "position-interpolation": r"\b[Pp]osition interpolation\b|\bPI\b",
    "s-hat": r"ŝ|\\hat ?\{?s\b",
    "sdpa": r"\bSDPA\b|\beager\b",
    "self-extend": r"\bSelf-Extend\b",
    "sink": r"\bsinks?\b",
    "spearman": r"\bSpearman|ρ|\\rho\b",
    "streamingllm": r"\bStreamingLLM\b",
    "teacher-forced": r"\b[Tt]eacher[- ]forc",
    "toeplitz": r"\bToeplitz\b",
    "window-bootstrap": r"\b[Ww]indow[- ]bootstrap",
    "yarn": r"\bYaRN\b",
}
ENTRY = re.compile(r'^### <a id="([a-z0-9-]+)"></a>(.+)$', re.MULTILINE)


def entries(text: str) -> dict[str, str]:
    """{anchor: the entry's text} of a glossary."""
    found = list(ENTRY.finditer(text))
    return {
        m.group(1): text[m.end() : found[i + 1].start() if i + 1 < len(found) else len(text)]
        for i, m in enumerate(found)
    }


NOT_PROSE = re.compile(r"^```.*?^```|!\[[^\]]*\]\([^)]*\)", re.MULTILINE | re.DOTALL)  # fenced code, images


def prose(text: str) -> str:
    """``text`` with fenced code blocks and images (their alt text) blanked, its line breaks kept."""
    return NOT_PROSE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def units(path: Path) -> list[str]:
    """A text's units of prose in reading order: a notebook's markdown cells, a Markdown file's lines."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return [prose("".join(c["source"])) for c in cells if c["cell_type"] == "markdown"]
    return prose(path.read_text(encoding="utf-8")).splitlines()


def late_terms(texts: list[str], glossary_link: str) -> list[str]:
    """One line per glossary term whose first use in ``texts`` comes before any unit that links it
    (a link ``(<glossary_link>#anchor)``); a unit that links the term may use it before the link."""
    late = []
    for anchor, pattern in TERMS.items():
        link = f"({glossary_link}#{anchor})"
        first_use = next((i for i, t in enumerate(texts) if re.search(pattern, t)), None)
        first_link = next((i for i, t in enumerate(texts) if link in t), None)
        if first_use is not None and (first_link is None or first_link > first_use):
            match = re.search(pattern, texts[first_use])
            context = texts[first_use][max(0, match.start() - 40) : match.end() + 20].replace("\n", " ")
            late.append(f"{anchor}: first used in unit {first_use} ({context!r}), linked {first_link}")
    return late


def test_every_entry_has_its_forms_and_every_form_its_entry():
    assert sorted(entries(GLOSSARY.read_text(encoding="utf-8"))) == sorted(TERMS)


@pytest.mark.parametrize("anchor", sorted(TERMS))
def test_every_entry_names_a_notebook_that_uses_the_term(anchor):
    text = entries(GLOSSARY.read_text(encoding="utf-8"))[anchor]
    named = re.findall(r"\]\((notebooks/[^)]+\.ipynb)\)", text)
    assert named, f"{anchor}: the entry names no notebook"
    introduced = ROOT / named[-1]
    assert introduced.is_file() and re.search(TERMS[anchor], "\n".join(units(introduced))), (anchor, named[-1])


@pytest.mark.parametrize("path", [*NOTEBOOKS, ROOT / "README.md"], ids=lambda p: p.name)
def test_every_glossary_term_is_linked_at_or_before_its_first_use(path):
    link = "../GLOSSARY.md" if path.suffix == ".ipynb" else "GLOSSARY.md"
    assert late_terms(units(path), link) == []


def test_a_term_used_before_its_link_is_reported():
    cells = ["Perplexity rises.", "The [perplexity](../GLOSSARY.md#perplexity) of the text.", "BCA"]
    assert late_terms(cells, "../GLOSSARY.md") == [
        "bca: first used in unit 2 ('BCA'), linked None",
        "perplexity: first used in unit 0 ('Perplexity rises.'), linked 1",
    ]
    cells[0] = "[Perplexity](../GLOSSARY.md#perplexity) rises; so does the [BCA](../GLOSSARY.md#bca) NLL."
    assert late_terms(cells, "../GLOSSARY.md") == [
        "nll: first used in unit 0 ('; so does the [BCA](../GLOSSARY.md#bca) NLL.'), linked None"
    ]
