"""Text with code spans, escaped for Markdown: the one escaping of the report, the compare page and the model cards.

Text is plain but for code spans, marked as CommonMark marks them: a run of n backticks opens a span that the next
run of exactly n closes (:func:`code` writes one around any text). The rest, model answers and params included, is
escaped (:func:`md_inline`): Markdown gets no HTML, links, emphasis or table cells from it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_BACKTICKS = re.compile(r"`+")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
# What Markdown would read as markup in text: HTML and entities, emphasis (but an underscore inside a word, as in
# r1_zero, which CommonMark never reads as emphasis), code, table cells, headings, an inline link's "(" after "]"
# (a reference link needs a definition, and a paragraph cannot start one: see reasonrl.report.document), and a
# backslash that would escape the character after it. Each is written with a backslash, CommonMark's escape.
_MD_SPECIAL = re.compile(r"[<>&*~`|#]|(?<![^\W_])_|_(?![^\W_])|(?<=\])\(|\\(?=[!-/:-@\[-`{-~]|$)")


def longest_backticks(text: str) -> int:
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)


def code(text: str) -> str:
    """``text`` as a code span, whatever backticks it holds: a fence longer than any run of them inside, and a space
    on each side when it starts or ends with a backtick or a space (CommonMark strips one space on each side)."""
    text = _LINE_BREAK.sub(" ", text)
    fence = "`" * (longest_backticks(text) + 1)
    padded = text == "" or (text.strip(" ") != "" and (text[0] in "` " or text[-1] in "` "))
    pad = " " if padded else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def spans(text: str) -> Iterator[tuple[str, bool]]:
    """``text`` (line breaks read as spaces) as pieces of plain text and code spans' contents, ``(piece, is_code)``;
    a run of backticks that nothing closes is plain text."""
    text = _LINE_BREAK.sub(" ", text)
    start = search = 0
    while opening := _BACKTICKS.search(text, search):
        width = len(opening[0])
        closing = next((run for run in _BACKTICKS.finditer(text, opening.end()) if len(run[0]) == width), None)
        if closing is None:
            search = opening.end()
            continue
        yield text[start : opening.start()], False
        content = text[opening.end() : closing.start()]
        if content.startswith(" ") and content.endswith(" ") and content.strip(" "):
            content = content[1:-1]
        yield content, True
        start = search = closing.end()
    yield text[start:], False


def md_escape(text: str) -> str:
    return _MD_SPECIAL.sub(lambda match: "\\" + match[0], text)


def md_inline(text: str, in_table: bool = False) -> str:
    """Text in Markdown, escaped; in a table, a ``|`` in a code span is escaped too (GFM splits cells first)."""
    return "".join(
        (code(piece).replace("|", "\\|") if in_table else code(piece)) if is_code else md_escape(piece)
        for piece, is_code in spans(text)
    )
