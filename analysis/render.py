"""Write a `Table` as Markdown, LaTeX (booktabs) and CSV, byte for byte the same for the same table."""
from __future__ import annotations

import io
from itertools import groupby
from pathlib import Path

import pandas as pd

from analysis.tables import Table

LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def flat_header(display: pd.DataFrame) -> list[str]:
    """'seq 1024 s/step' for a grouped column, the bare name otherwise."""
    return [f"{group} {name}" if group else name for group, name in display.columns]


def to_markdown(display: pd.DataFrame) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(text.replace("|", r"\|") for text in cells) + " |"

    header = flat_header(display)
    rule = "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|"
    return "\n".join([line(header), rule, *(line(list(row)) for row in display.itertuples(index=False))]) + "\n"


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIALS.get(char, char) for char in text)


def to_latex(display: pd.DataFrame) -> str:
    """A booktabs tabular; grouped columns get a spanning header with a cmidrule under it."""
    groups = [(group, len(list(members))) for group, members in groupby(group for group, _ in display.columns)]
    lines = [r"\begin{tabular}{l" + "r" * (len(display.columns) - 1) + "}", r"\toprule"]
    if any(group for group, _ in groups):
        spans, rules, first = [], [], 1
        for group, width in groups:
            if group:
                spans.append(rf"\multicolumn{{{width}}}{{c}}{{{latex_escape(group)}}}")
                rules.append(rf"\cmidrule(lr){{{first}-{first + width - 1}}}")
            else:
                spans.extend([""] * width)
            first += width
        lines += [" & ".join(spans) + r" \\", " ".join(rules)]
    lines.append(" & ".join(latex_escape(name) for _, name in display.columns) + r" \\")
    lines.append(r"\midrule")
    lines += [" & ".join(latex_escape(text) for text in row) + r" \\" for row in display.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_csv(frame: pd.DataFrame) -> str:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")
    return buffer.getvalue()


def write_table(table: Table, out_dir: str | Path) -> list[Path]:
    """<name>.md, <name>.tex, <name>.csv (what the reader sees) and <name>_values.csv (the numbers). A
    caption heads the Markdown as an italic line; the LaTeX stays a bare tabular for the paper's own
    caption, and the CSVs stay data."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flat = table.display.set_axis(flat_header(table.display), axis="columns")
    texts = {
        f"{table.name}.md": _caption_line(table.caption) + to_markdown(table.display),
        f"{table.name}.tex": to_latex(table.display),
        f"{table.name}.csv": to_csv(flat),
        f"{table.name}_values.csv": to_csv(table.values),
    }
    paths = []
    for name, text in texts.items():
        path = out_dir / name
        path.write_text(text)
        paths.append(path)
    return paths


def _caption_line(caption: str) -> str:
    """'*caption*' and a blank line before the table; nothing for a table without one."""
    return f"*{caption}*\n\n" if caption else ""
