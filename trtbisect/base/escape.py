"""A model's names are hostile input: every string a model controls (node, tensor, input and
output names, op types, paths, the diagnosis sentences that quote them) is escaped for where it
goes, by one of these helpers.

- a terminal or a log (`visible`): control characters (ESC sequences, OSC 52, a carriage return
  that overwrites the line, BEL), bidi overrides and isolates, line and paragraph separators and
  every other invisible or format character are shown as `\\x1b`, `\\u202e`, ...; a model cannot
  clear the screen, hide text, reorder a line or write to the clipboard;
- Markdown (`md_code` for a name, `md_text` for a sentence, `md_fence` for a block): no raw
  HTML, no link or image, no heading or list started by a name, no way out of a code span or a
  fenced block, `|` that cannot split a table cell;
- HTML: `html.escape` (report.py); JSON: json's own escaping; shell: `shlex.quote` (render.py).

What people read (the console, logs, report.md, report.html) also shows a name of absurd length
shortened (`shortened`): a 100,000-character node name would otherwise fill 12,000 lines. The
full name stays where machines read it: precision.json, the renderings, commands.sh.
"""

from __future__ import annotations

import logging
import re

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: object) -> str:
    """`text` with every character a terminal would not print as itself shown escaped
    (`\\x1b`, `\\u202e`): Python's notion of printable, plus the space."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or c == " " else _escaped(c) for c in s)


LONG = 200  # a run of non-space characters longer than this is shortened for people
KEEP = 60  # characters kept at each end of it
LINE = 4000  # a whole string longer than this (a long name with spaces in it) too
_LONG_RUN = re.compile(rf"\S{{{LONG + 1},}}")


def _cut(s: str, keep: int) -> str:
    return f"{s[:keep]}\u2026[{len(s)} chars]\u2026{s[-keep:]}"


def shortened(text: str) -> str:
    """`text` for people: each run of more than LONG non-space characters as its first and
    last KEEP characters around its length (`abc…[100000 chars]…xyz`), and the whole at most
    about LINE characters. Apply after escaping (`visible`), so the length is what would show."""
    if len(text) <= LONG:
        return text
    s = _LONG_RUN.sub(lambda m: _cut(m.group(), KEEP), text)
    return s if len(s) <= LINE else _cut(s, LINE // 2)


def shown_text(text: object) -> str:
    """`visible`, then `shortened`: a model's string for a terminal, a log or a report."""
    return shortened(visible(text))


_MD_INLINE = re.compile(r"([\\`*_\[\]<>&~])")  # what acts anywhere in a line
_MD_LEADING = re.compile(r"^(\s*)(?:([#>+=-])|(\d+)([.)]))")  # what acts at a block's start


def md_text(text: object) -> str:
    """A sentence for Markdown prose, a list item or a table cell: visible (so no line break
    can start a heading), with what Markdown or HTML would act on backslash-escaped: raw HTML,
    entities, emphasis, links and images, code spans, and a block marker at its start. (`|`
    matters only in tables: `md_table_cell`.)"""
    s = _MD_INLINE.sub(r"\\\1", shown_text(text))
    return _MD_LEADING.sub(lambda m: m.group(1) + (f"\\{m.group(2)}" if m.group(2) else
                                                   f"{m.group(3)}\\{m.group(4)}"), s)


def md_code(text: object) -> str:
    """A name as a Markdown code span that nothing in it can end: its fence is one backtick
    longer than the longest run of backticks in it (CommonMark 6.1). Code spans show HTML as
    text. In a table, `md_table_cell` also escapes its `|` (GFM splits rows before spans)."""
    s = shown_text(text)
    longest = max((len(run) for run in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_table_cell(cell: str) -> str:
    """Markdown that is already escaped, for one GFM table cell: `|` escaped (also inside code
    spans, where GFM reads `\\|` as `|`), no line breaks."""
    return cell.replace("|", "\\|").replace("\n", " ")


def md_fence(text: str, info: str = "") -> list[str]:
    """Lines of a fenced code block that `text` cannot close: the fence is longer than any run
    of backticks in it. The text's own lines stay as they are (commands may hold names with
    line breaks inside their quotes); only `\\r` and other controls are shown escaped."""
    body = "\n".join(shown_text(line) for line in text.split("\n"))
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, body, fence]


class VisibleLog(logging.Filter):
    """Every log line shown with `visible`: a model string formatted into a message cannot
    send escape sequences to the terminal or forge a line (trtbisect's own messages hold no
    control characters)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = shown_text(message)
        if shown != message:
            record.msg, record.args = shown, ()
        return True
