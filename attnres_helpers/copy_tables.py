"""The copy probe against its scrambled control, as tables and lines (notebooks 03 and 05): what the
*order* of the first copy is worth (:meth:`probe.CopyProbes.scrambled`, ``data/results/copy_control.safetensors``)."""

from __future__ import annotations

from .tables import Stat, table_ordered

SCRAMBLED_COLUMNS = ["encoding", "seeds", "g = 0", "g = L/2", "g = 3L/2", "unrelated, g = L/2"]


def scrambled_control_rows(curves: dict, control: dict, train_len: int) -> list[dict]:
    """Per encoding (causal mask), over seeds: the copy gain over the scrambled control (``control``:
    :func:`store.load_curves` of the copy-control store) at g = 0, L/2 and 3L/2, beside the gain over
    the unrelated span at L/2 (``curves``, the shipped store's). Runs are named ``<encoding>-s<seed>``."""
    gaps = {"g = 0": 0, "g = L/2": train_len // 2, "g = 3L/2": 3 * train_len // 2}
    by_encoding: dict[str, dict[int, str]] = {}
    for run, bca in control:
        if not bca:
            encoding, seed = run.rsplit("-s", 1)
            by_encoding.setdefault(encoding, {})[int(seed)] = run
    rows = []
    for encoding in table_ordered(by_encoding):
        runs = by_encoding[encoding]
        row = {"encoding": encoding, "seeds": len(runs)}
        for column, gap in gaps.items():
            row[column] = Stat.of({s: control[(r, False)].gain(gap) for s, r in runs.items()})
        row["unrelated, g = L/2"] = Stat.of({s: curves[(r, False)].gain(gaps["g = L/2"]) for s, r in runs.items()})
        rows.append(row)
    return rows


def scrambled_control_lines(rows: list[dict]) -> list[str]:
    """The scrambled control in four lines (notebooks 03 and 05): how often the order of the first copy
    is worth something inside L, its share of the gain over an unrelated span, and which encodings copy
    in order at both gaps inside L in every seed (the probe's in-distribution check)."""
    within = [v for row in rows for v in row["g = L/2"].values]
    adjacent = [v for row in rows for v in row["g = 0"].values]
    unrelated = [v for row in rows for v in row["unrelated, g = L/2"].values]
    passing = [row["encoding"] for row in rows if all(v > 0 for g in ("g = 0", "g = L/2") for v in row[g].values)]
    return [
        f"inside L (g = L/2): ordered gain > 0 in {sum(v > 0 for v in within)} of {len(within)} models, "
        f"mean {sum(within) / len(within):+.4f}, largest {max(within):+.4f} nats a byte",
        f"adjacent copies (g = 0): ordered gain > 0 in {sum(v > 0 for v in adjacent)} of {len(adjacent)} models, "
        f"mean {sum(adjacent) / len(adjacent):+.4f}",
        f"the order's share of the gain over an unrelated span at g = L/2: {sum(within) / sum(unrelated):.0%}",
        "encodings whose every seed copies in order inside L (ordered gain > 0 at g = 0 and at g = L/2): "
        f"{len(passing)} of {len(rows)} {passing}",
    ]
