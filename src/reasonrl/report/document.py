"""The report as a document: blocks (headings, paragraphs, tables, figures, code) built once, rendered twice:
Markdown that links the PNG files and a self-contained HTML page with the PNGs inline."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str
    """Plain text; `backticks` mark code in both renderings."""


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
    warnings: list[str] = field(default_factory=list)
    """Problems the stage prints to stderr (e.g. why the experiments could not be listed)."""


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fence(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render_markdown(blocks: list[Block], figures_prefix: str = "figures") -> str:
    """Markdown; figures link ``{figures_prefix}/{name}`` (relative to the Markdown file)."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Table):
            lines = ["| " + " | ".join(_md_cell(h) for h in block.headers) + " |"]
            lines.append("|" + "---|" * len(block.headers))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            parts.append("\n".join(lines))
        elif isinstance(block, Figure):
            parts.append(f"![{block.caption}]({figures_prefix}/{block.name})\n\n*{block.caption}*")
        elif isinstance(block, Code):
            fence = _fence(block.text)
            parts.append(f"{fence}text\n{block.text}\n{fence}")
    return "\n\n".join(parts) + "\n"


def _html_text(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


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
