"""How the explorers write numbers and messages: significant figures, ratios, error and note lines,
and the visible text of a readout's HTML (for the static pictures)."""

from __future__ import annotations

import html
import math
import re

SIG_DIGITS = 3  # significant figures of the readouts
RATIO_FLOOR = 1e-12  # below this R(L) the ratio R(2L)/R(L) is reported as undefined


def format_sig(x: float | None, digits: int = SIG_DIGITS) -> str:
    """``x`` to ``digits`` significant figures: scientific below 1e-3 (and from 1e4), "0" for zero.

    ``format_sig(0.0088687) == "0.00887"``, ``format_sig(9.5367e-07) == "9.54e-07"``,
    ``format_sig(1.0) == "1.00"``; NaN reads "undefined", None (not measured) "n/a".
    """
    if x is None:
        return "n/a"
    x = float(x)
    if math.isnan(x):
        return "undefined"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    scientific = f"{x:.{digits - 1}e}"
    rounded = float(scientific)
    if not 1e-3 <= abs(rounded) < 1e4:
        return scientific
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:.{decimals}f}"


def format_ratio(r_L: float, ratio: float) -> str:
    """R(2L)/R(L) as shown: :func:`format_sig`, or "undefined" with the reason when R(L) is (near) zero."""
    if math.isnan(ratio):
        return "undefined (R(L) = 0)" if r_L == 0 else f"undefined (R(L) < {RATIO_FLOOR:.0e})"
    return format_sig(ratio)


def pair_text(r_L: float, r_2L: float, ratio: float) -> str:
    """ "R(L) = … · R(2L) = … · R(2L)/R(L) = …" as the readouts show it (HTML)."""
    return (
        f"R(L) = {format_sig(r_L)} &nbsp;·&nbsp; R(2L) = {format_sig(r_2L)} &nbsp;·&nbsp; "
        f"R(2L)/R(L) = {format_ratio(r_L, ratio)}"
    )


def error_html(exc: Exception) -> str:
    """One line naming the error, for the explorers' error box."""
    return f"<b>{type(exc).__name__}</b>: {html.escape(str(exc))} &nbsp;(the plot and readout were not updated)"


def lines_html(lines: list[str], style: str = "") -> str:
    """Plain-text lines as HTML, escaped, one per line, each in a span with ``style``."""
    return "<br>".join(f"<span style='{style}'>{html.escape(line, quote=False)}</span>" for line in lines)


def visible_text(markup: str) -> str:
    """The text a browser shows for a readout's HTML, one line per <br> or table row, table cells
    separated by " | "."""
    text = re.sub(r"</tr>|<br\s*/?>|<table", "\n\\g<0>", markup)
    text = re.sub(r"</t[dh]>\s*(?=<t[dh])", " | ", text)
    text = re.sub(r"<[^>]+>", "", text)
    lines = [" ".join(html.unescape(line).split()) for line in text.split("\n")]
    return "\n".join(line for line in lines if line)
