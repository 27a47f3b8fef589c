"""The report as a document: blocks (headings, paragraphs, tables, figures, code) built once, rendered twice:
Markdown that links the PNG files and a self-contained HTML page with the PNGs inline.

Text in the blocks is plain but for code spans, marked as CommonMark marks them (:mod:`reasonrl.markdown`, whose
:func:`~reasonrl.markdown.code` writes one around any text). The rest, model answers and params included, is
escaped in both renderings: Markdown gets no HTML, links, emphasis or table cells from it, as HTML gets no tags.
"""

from __future__ import annotations

import base64
import html
import os
import re
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
class Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Figure:
    name: str
    """File name of the PNG in :attr:`Report.figures` (and in the figures directory)."""
    caption: str


@dataclass(frozen=True)
class Code:
    text: str


Block = Heading | Paragraph | Table | Figure | Code


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


def render_markdown(blocks: list[Block], figures_prefix: str = "figures") -> str:
    """Markdown; figures link ``{figures_prefix}/{name}`` (relative to the Markdown file)."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {md_inline(block.text)}")
        elif isinstance(block, Paragraph):
            parts.append(_md_paragraph(block.text))
        elif isinstance(block, Table):
            lines = ["| " + " | ".join(md_inline(h, in_table=True) for h in block.headers) + " |"]
            lines.append("|" + "---|" * len(block.headers))
            lines += ["| " + " | ".join(md_inline(c, in_table=True) for c in row) + " |" for row in block.rows]
            parts.append("\n".join(lines))
        elif isinstance(block, Figure):
            # The caption as the image's alt text is plain text, as in the HTML's alt attribute.
            alt = md_escape(block.caption).replace("[", "\\[").replace("]", "\\]")
            url = quote(f"{figures_prefix}/{block.name}")
            parts.append(f"![{alt}]({url})\n\n*{md_inline(block.caption.strip())}*")
        elif isinstance(block, Code):
            fence = _fence(block.text)
            parts.append(f"{fence}text\n{block.text}\n{fence}")
    return "\n\n".join(parts) + "\n"


def _html_text(text: str) -> str:
    """Escaped text, its code spans in <code>."""
    return "".join(
        f"<code>{html.escape(piece)}</code>" if is_code else html.escape(piece) for piece, is_code in spans(text)
    )


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: left; }
th { background: #f3f3f3; }
figure { margin: 1rem 0; } img { max-width: 100%; }
figcaption { font-style: italic; color: #555; }
pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; white-space: pre-wrap; }
"""


def render_html(blocks: list[Block], figures: Mapping[str, bytes], title: str = "reasonrl report") -> str:
    """A self-contained HTML page: styles inline, each figure a ``data:image/png;base64`` URI."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_html_text(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_html_text(block.text)}</p>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{_html_text(h)}</th>" for h in block.headers)
            body = "".join("<tr>" + "".join(f"<td>{_html_text(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(block, Figure):
            data = base64.b64encode(figures[block.name]).decode("ascii")
            caption = _html_text(block.caption)
            parts.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(block.caption)}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
        elif isinstance(block, Code):
            parts.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
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
        prefix = Path(os.path.relpath(figures_dir, Path(markdown).parent)).as_posix()
        atomic_write_text(markdown, render_markdown(report.blocks, prefix))
    if html_page is not None:
        atomic_write_text(html_page, render_html(report.blocks, report.figures, title))
