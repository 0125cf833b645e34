"""Pieces of the self-contained HTML pages (evaluation report, comparison, history): tables, figures, the page,
and the check of the directory a page is written to."""

from __future__ import annotations

import base64
import html
import io
import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from hashdist.data.atomic import check_output, read_head, read_marker

TITLE_CHARS_PER_INCH = 11  # characters of a default-size title per inch of axes
DPI = 90  # pixels per inch of the pages' figures
MIN_FONT_PT = 9  # the smallest text of a figure (11.25 px at DPI)
MIN_SHOWN_PX = 9  # a figure is never shown so small that its smallest text is under this (it scrolls instead)
PROVENANCE_CAPTION = "What made these numbers: when, with which packages, data and parameters"
MIN_TEXT_KEY = "hashdist-min-text-px"  # the PNG text chunk that records the figure's smallest text, in pixels


def fmt(x, digits: int = 4) -> str:
    """A number for tables: fixed digits, 'n/a' for undefined (None or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return str(x) if isinstance(x, int) else f"{x:.{digits}f}"


_SUPERSCRIPTS = str.maketrans("0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b")


def _power_of_ten(value, _position) -> str:
    """A log axis's tick label: 10 with a Unicode superscript exponent (no mathtext: its parser costs about
    0.1 s to set up in a process and 0.03 s a figure); other values as %g."""
    exponent = round(math.log10(value)) if value > 0 else None
    if exponent is not None and math.isclose(value, 10.0**exponent):
        return "10" + str(exponent).translate(_SUPERSCRIPTS)
    return f"{value:g}"


def log_count_axes(ax, x_max: float, y_max: float) -> None:
    """Log-log axes for counts >= 1 up to x_max and y_max, each spanning at least a decade (two labelled ticks,
    even when every count is 1 to 3)."""
    ax.set(xscale="log", yscale="log", xlim=(0.8, max(12, 1.25 * x_max)), ylim=(0.8, max(12, 1.25 * y_max)))


def png(fig) -> str:
    """A matplotlib figure as base64 PNG (embedded in the page, no external files).

    Laid out by matplotlib's tight layout engine as it draws: one draw, where ``bbox_inches="tight"``
    draws twice. No minor ticks: on a log axis they cost as much to lay out as the rest of the figure.
    Together about half the time (0.1 to 0.2 s a figure). Titles are wrapped to their axes' width; log axes
    are labelled 10\u207f. No text is smaller than MIN_FONT_PT; the PNG records its smallest text's size in
    pixels (MIN_TEXT_KEY), which the page uses to keep the figure readable at any width."""
    from matplotlib.text import Text
    from matplotlib.ticker import FuncFormatter

    for ax in fig.axes:
        ax.minorticks_off()
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                axis.set_major_formatter(FuncFormatter(_power_of_ten))
        width = ax.get_position().width * fig.get_figwidth()
        ax.set_title(textwrap.fill(ax.get_title(), width=max(20, int(TITLE_CHARS_PER_INCH * width))))
    texts = [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]
    for text in texts:
        text.set_fontsize(max(text.get_fontsize(), MIN_FONT_PT))
    smallest = min((t.get_fontsize() for t in texts), default=MIN_FONT_PT) * DPI / 72
    fig.set_layout_engine("tight")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={MIN_TEXT_KEY: f"{smallest:.2f}"})
    return base64.b64encode(buf.getvalue()).decode()


def png_facts(data: str) -> tuple[int, float]:
    """(width in pixels, smallest text in pixels) of a base64 PNG made by :func:`png`, from its header and text
    chunk."""
    raw = base64.b64decode(data)
    width, position, smallest = int.from_bytes(raw[16:20], "big"), 8, float(MIN_FONT_PT * DPI / 72)
    while position + 8 <= len(raw):
        length, kind = int.from_bytes(raw[position:position + 4], "big"), raw[position + 4:position + 8]
        if kind == b"tEXt":
            key, _, value = raw[position + 8:position + 8 + length].partition(b"\0")
            if key.decode("latin-1") == MIN_TEXT_KEY:
                smallest = float(value)
        position += 12 + length
    return width, smallest


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (figures are only saved as PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Figure(NamedTuple):
    """A figure of a page: how to draw it and what its caption says."""

    draw: Callable  # (pyplot, *the page's data) -> a matplotlib figure, or None where the page has no such figure
    caption: str
    wide: bool = False  # spans the page's width (the figure grid's whole row)


def draw_figures(figures: dict[str, Figure], *data) -> dict[str, str]:
    """Every figure of a table of ``figures`` drawn from ``data`` as a base64 PNG, by name, in table order; a
    figure whose ``draw`` returns None is left out."""
    plt = pyplot()
    out = {}
    for name, figure in figures.items():
        fig = figure.draw(plt, *data)
        if fig is not None:
            out[name] = png(fig)
            plt.close(fig)
    return out


def text_table(caption: str, header: list[str], rows: list[list[str]]) -> str:
    """An aligned plain-text table under its caption (first column left, the rest right)."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]

    def line(cells):
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in pairs)

    return "\n".join([caption, line(header), *(line(r) for r in rows)])


def html_table(caption: str, header: list[str], rows: list[list[str]], table_id: str = "") -> str:
    ident = f' id="{html.escape(table_id)}"' if table_id else ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class='scroll'><table{ident}><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr>" \
           f"</thead><tbody>{body}</tbody></table></div>"  # a table wider than the page scrolls in its box


def html_definitions(terms: list[tuple[str, str]]) -> str:
    """A definition list: each term, then what it means."""
    return "<dl>" + "".join(f"<dt>{html.escape(t)}</dt><dd>{html.escape(d)}</dd>" for t, d in terms) + "</dl>"


def html_figure(name: str, data: str, caption: str, wide: bool = False) -> str:
    """A captioned PNG figure; the caption says what is plotted and the convention behind it."""
    kind = ' class="wide"' if wide else ""
    width, smallest = png_facts(data)
    # never narrower than where its smallest text would fall under MIN_SHOWN_PX: on a narrow screen, it scrolls
    floor = math.ceil(width * min(1.0, MIN_SHOWN_PX / smallest))
    return (f'<figure id="fig-{html.escape(name)}"{kind}><div class="plot"><img alt="{html.escape(caption)}" '
            f'style="min-width:{floor}px" data-min-text-px="{smallest:.2f}" src="data:image/png;base64,{data}">'
            f'</div><figcaption>{html.escape(caption)}</figcaption></figure>')


def html_figures(figures: dict[str, Figure], images: dict[str, str], caption=lambda text: text) -> str:
    """The drawn ``images`` of a table of ``figures`` in a grid (two columns where the page is wide enough, a wide
    figure across the row); ``caption(text)`` adapts a caption to the page."""
    return "<div class='figures'>" + "".join(
        html_figure(name, data, caption(figures[name].caption), figures[name].wide) for name, data in images.items()
    ) + "</div>"


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1150px;margin:auto;padding:0 12px;color:#222}"
    "table{border-collapse:collapse;margin:10px 0 18px;min-width:min(100%,560px)}"
    # a caption stays in view, wrapped to the visible width, while its wide table scrolls under it
    "caption{text-align:left;font-weight:600;padding:4px 0;position:sticky;left:0;max-width:calc(100vw - 40px)}"
    "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}thead th{background:#f2f2f2}"
    "figure{display:inline-block;vertical-align:top;margin:8px;max-width:520px}"
    ".figures{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,440px),1fr));gap:12px}"
    ".figures figure{margin:0;max-width:none}.figures .wide{grid-column:1/-1}"
    ".figures .wide img{max-width:min(100%,900px)}.plot{overflow-x:auto}"
    "figcaption{font-size:13px;color:#444;margin-top:4px}img{max-width:100%}"
    "dl{font-size:13px}dt{font-weight:600;margin-top:6px}dd{margin-left:16px;color:#444}"
    ".headline{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:4px 16px;margin:8px 0 16px}"
    ".lead{font-size:18px}.measures{columns:2 260px;font-size:14px}"
    "#provenance td{text-align:left;overflow-wrap:anywhere}"
    ".scroll{overflow-x:auto;max-width:100%}.nowrap,#table-tasks td{white-space:nowrap}"
    ".board td,.board th{padding:3px 4px;font-size:12px}.board .interval{color:#555}"
    "@media (max-width:600px){figure{max-width:100%;margin:8px 0}}"
)


def page(title: str, body: str, marker: str | None = None) -> str:
    """A complete self-contained HTML document; ``marker``: its format, in a ``<meta name="hashdist-format">``
    at the start (:func:`has_page_marker`), for a page that is a file of its own (a history page)."""
    meta = "" if marker is None else f"<meta name='hashdist-format' content='{html.escape(marker)}'>"
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>{meta}<title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{body}</body></html>")


def has_page_marker(path: Path, marker: str) -> bool:
    """Whether ``path`` is a regular file (not a link) starting as :func:`page` starts a page with ``marker``."""
    head = f"<!doctype html><html lang='en'><head><meta charset='utf-8'><meta name='hashdist-format' " \
           f"content='{html.escape(marker)}'>".encode()
    return read_head(path, len(head)) == head


def check_replaceable_dir(out, inputs, *, what: str, marker_file: str, marker: str, kept=()) -> Path:
    """Refuse, before any work, an ``out`` that is not a new path, an empty directory or a previous hashdist
    ``what`` directory (its ``marker_file`` with the format ``marker``, replaced by a rerun), and one that overlaps
    an input path or the block cache (``kept``); see :func:`hashdist.data.atomic.check_output`."""
    return check_output(out, f"{what} directory", lambda path: read_marker(path / marker_file, "format") == marker,
                        overwrite=None, inputs=inputs, kept=kept)
