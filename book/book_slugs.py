"""The book's heading anchors: GitHub's slugs, except for the glossary's headings, whose anchors are the
ids written in them (``### <a id="sink"></a>Sink (attention sink)``), as GitHub and JupyterLab follow them."""

import re
from pathlib import Path

from myst_parser.slugs import github_slugify

GLOSSARY = Path(__file__).resolve().parents[1] / "GLOSSARY.md"
IDS = {
    title.strip(): anchor
    for anchor, title in re.findall(r'^#+ <a id="([^"]+)"></a>(.+)$', GLOSSARY.read_text("utf-8"), re.M)
}


def heading_slug(title: str) -> str:
    return IDS.get(title.strip()) or github_slugify(title)
