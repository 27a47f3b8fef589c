"""The report as a document: blocks (headings, paragraphs, notes, tables, figures, examples, code) built once,
rendered twice: Markdown that links the PNG files and a self-contained HTML page with the PNGs inline, readable on a
phone (a viewport, tables that scroll sideways, figures no wider than the page).

Text in the blocks is plain but for code spans, marked as CommonMark marks them (:mod:`reasonrl.markdown`, whose
:func:`~reasonrl.markdown.code` writes one around any text). The rest, model answers and params included, is
escaped in both renderings: Markdown gets no HTML, links, emphasis or table cells from it, as HTML gets no tags.
"""

from __future__ import annotations

import base64
import html
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from reasonrl.atomic import atomic_directory, atomic_write_text
from reasonrl.markdown import longest_backticks, md_escape, md_inline, spans


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str
    """Plain text; `backticks` mark code in both renderings (see the module's docstring)."""


@dataclass(frozen=True)
class Note:
    """A paragraph set apart, for what a reader must know before the numbers (e.g. that the model is a toy)."""

    text: str


@dataclass(frozen=True)
class Link:
    """A table cell that links a file: ``path`` relative to the working directory (the repository root, where the
    stages run), written relative to the page that links it."""

    text: str
    path: str


Cell = str | Link


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[Cell]]


@dataclass(frozen=True)
class Figure:
    name: str
    """File name of the PNG in :attr:`Report.figures` (and in the figures directory)."""
    caption: str
    alt: str = ""
    """A short text instead of the image; empty: its file name in words (the caption follows the image, once)."""


@dataclass(frozen=True)
class Code:
    text: str


@dataclass(frozen=True)
class Example:
    """A question, its gold answer, and one or more model answers to it, each with a label (route, step, reward)."""

    title: str
    question: str
    gold_answer: str
    answers: list[tuple[str, str]]
    """``(label, answer)`` pairs; the label is plain text with code spans, the answer verbatim."""


Block = Heading | Paragraph | Note | Table | Figure | Code | Example


@dataclass
class Report:
    blocks: list[Block] = field(default_factory=list)
    figures: dict[str, bytes] = field(default_factory=dict)
    """PNG bytes by file name."""


# At a paragraph's start: a list item, a thematic break, a link reference definition.
_MD_BLOCK_START = re.compile(r"[-+\[]|\d{1,9}(?=[.)](?:\s|$))")


def _md_paragraph(text: str) -> str:
    rendered = md_inline(text).lstrip()
    if match := _MD_BLOCK_START.match(rendered):
        at = match.end() if match[0].isdigit() else 0  # "1." → "1\.", "-" → "\-"
        rendered = f"{rendered[:at]}\\{rendered[at:]}"
    return rendered


def _fence(text: str) -> str:
    return "`" * max(3, longest_backticks(text) + 1)


def _href(link: Link, page_dir: Path) -> str:
    return quote(Path(os.path.relpath(link.path, page_dir)).as_posix())


def _md_cell(cell: Cell, page_dir: Path) -> str:
    if isinstance(cell, Link):
        text = md_inline(cell.text, in_table=True).replace("[", "\\[").replace("]", "\\]")
        return f"[{text}]({_href(cell, page_dir)})"
    return md_inline(cell, in_table=True)


def _md_table(table: Table, page_dir: Path) -> str:
    lines = ["| " + " | ".join(md_inline(h, in_table=True) for h in table.headers) + " |"]
    lines.append("|" + "---|" * len(table.headers))
    lines += ["| " + " | ".join(_md_cell(c, page_dir) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _md_example(example: Example) -> str:
    parts = [f"**{md_inline(example.title)}**", f"Question: {md_inline(example.question)}"]
    parts.append(f"Gold answer: {md_inline(example.gold_answer)}")
    for label, answer in example.answers:
        fence = _fence(answer)
        parts += [f"{md_inline(label)}:", f"{fence}text\n{answer}\n{fence}"]
    return "\n\n".join(parts)


def _alt(figure: Figure) -> str:
    return figure.alt or Path(figure.name).stem.replace("_", " ")


def render_markdown(blocks: list[Block], figures_prefix: str = "figures", page_dir: str | Path = ".") -> str:
    """Markdown; figures link ``{figures_prefix}/{name}`` and :class:`Link` cells their file, both relative to the
    Markdown file, which lies in ``page_dir``."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {md_inline(block.text)}")
        elif isinstance(block, Paragraph):
            parts.append(_md_paragraph(block.text))
        elif isinstance(block, Note):
            parts.append(f"> **Note:** {md_inline(block.text)}")
        elif isinstance(block, Table):
            parts.append(_md_table(block, Path(page_dir)))
        elif isinstance(block, Figure):
            # The alt text is plain text, as in the HTML's alt attribute; the caption is written once, below.
            alt = md_escape(_alt(block)).replace("[", "\\[").replace("]", "\\]")
            url = quote(f"{figures_prefix}/{block.name}")
            parts.append(f"![{alt}]({url})\n\n*{md_inline(block.caption.strip())}*")
        elif isinstance(block, Code):
            fence = _fence(block.text)
            parts.append(f"{fence}text\n{block.text}\n{fence}")
        elif isinstance(block, Example):
            parts.append(_md_example(block))
    return "\n\n".join(parts) + "\n"


def _html_text(text: str) -> str:
    """Escaped text, its code spans in <code>."""
    return "".join(
        f"<code>{html.escape(piece)}</code>" if is_code else html.escape(piece) for piece, is_code in spans(text)
    )


# Every figure and table fits the page at any width: an image shrinks to its container (keeping its aspect), a table
# or a code block scrolls sideways inside its own box; an example's question sits beside its answers where the
# page is wide enough, above them where it is not.
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem; color: #222;
  line-height: 1.45; }
.table-scroll { overflow-x: auto; max-width: 100%; margin: 1rem 0; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
figure { margin: 1rem 0; max-width: 100%; }
img { max-width: 100%; height: auto; }
figcaption { font-style: italic; color: #555; }
pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; white-space: pre-wrap; max-width: 100%; }
.note { border-left: 4px solid #e69f00; background: #fff8e6; padding: 0.6rem 1rem; margin: 1rem 0; }
.example { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 2fr); gap: 0 1.5rem;
  border-top: 1px solid #ddd; padding-top: 0.5rem; margin: 1rem 0; }
.example h4 { grid-column: 1 / -1; margin: 0.3rem 0; }
@media (max-width: 40rem) { body { margin: 1rem auto; } .example { grid-template-columns: minmax(0, 1fr); } }
"""


def png_size(png: bytes) -> tuple[int, int]:
    """The width and height in pixels of a PNG (its IHDR chunk, which the format puts first)."""
    width, height = struct.unpack(">II", png[16:24])
    return width, height


# The figures are drawn at twice the pixels they are shown at: sharp on high-density screens.
PIXELS_PER_CSS_PIXEL = 2


def _html_figure(figure: Figure, png: bytes) -> str:
    width, height = (size // PIXELS_PER_CSS_PIXEL for size in png_size(png))
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
        f'alt="{html.escape(_alt(figure))}"><figcaption>{_html_text(figure.caption)}</figcaption></figure>'
    )


def _html_table(table: Table, page_dir: Path) -> str:
    def cell(value: Cell) -> str:
        if isinstance(value, Link):
            return f'<a href="{html.escape(_href(value, page_dir))}">{_html_text(value.text)}</a>'
        return _html_text(value)

    head = "".join(f"<th>{_html_text(h)}</th>" for h in table.headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    return f'<div class="table-scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _html_example(example: Example) -> str:
    answers = "".join(
        f"<p>{_html_text(label)}:</p><pre><code>{html.escape(answer)}</code></pre>" for label, answer in example.answers
    )
    return (
        f'<div class="example"><h4>{_html_text(example.title)}</h4>'
        f"<div><p><strong>Question:</strong> {_html_text(example.question)}</p>"
        f"<p><strong>Gold answer:</strong> {_html_text(example.gold_answer)}</p></div>"
        f"<div>{answers}</div></div>"
    )


def _html_block(block: Block, figures: Mapping[str, bytes], page_dir: Path) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{_html_text(block.text)}</h{block.level}>"
    if isinstance(block, Paragraph):
        return f"<p>{_html_text(block.text)}</p>"
    if isinstance(block, Note):
        return f'<p class="note"><strong>Note:</strong> {_html_text(block.text)}</p>'
    if isinstance(block, Table):
        return _html_table(block, page_dir)
    if isinstance(block, Figure):
        return _html_figure(block, figures[block.name])
    if isinstance(block, Example):
        return _html_example(block)
    return f"<pre><code>{html.escape(block.text)}</code></pre>"


def render_html(
    blocks: list[Block], figures: Mapping[str, bytes], title: str = "reasonrl report", page_dir: str | Path = "."
) -> str:
    """A self-contained HTML page: styles inline, each figure a ``data:image/png;base64`` URI; :class:`Link` cells
    relative to ``page_dir``, where the page lies."""
    body = "\n".join(_html_block(block, figures, Path(page_dir)) for block in blocks)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{html.escape(title)}</title>\n'
        f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def write_report(
    report: Report,
    markdown: str | Path | None,
    html_page: str | Path | None,
    figures_dir: str | Path | None,
    title: str = "reasonrl report",
) -> None:
    """Write the Markdown (linking the PNGs in ``figures_dir``, which needs one) and the self-contained HTML page;
    each one only when its path is given."""
    if markdown is not None:
        if figures_dir is None:
            raise ValueError("a Markdown report links its figures: it needs a figures directory")
        with atomic_directory(figures_dir) as staging:
            for name, png in report.figures.items():
                (staging / name).write_bytes(png)
        page_dir = Path(markdown).parent
        prefix = Path(os.path.relpath(figures_dir, page_dir)).as_posix()
        atomic_write_text(markdown, render_markdown(report.blocks, prefix, page_dir))
    if html_page is not None:
        atomic_write_text(html_page, render_html(report.blocks, report.figures, title, Path(html_page).parent))
