"""Pages for Snakemake's HTML report (``snakemake --report report.html``), next to reports/.

Snakemake shows images and tables itself, but takes each entry's caption from a file named in
the rule, and does not render Markdown. So ``race report`` also writes:

* ``captions/<figure>.rst`` -- each figure's own caption, from
  :data:`race.analysis.report.FIGURE_CAPTIONS` (the captions report.md uses: one source);
* ``report.html`` -- report.md rendered to HTML (markdown-it, CommonMark with tables), so the
  report's text and tables read inside the Snakemake report.
"""

from __future__ import annotations

import html
from pathlib import Path

from race.analysis.report import FIGURE_CAPTIONS
from race.core.atomic import write_text_atomic

CAPTION_DIR = "captions"
PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.4}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 6px}}</style>
</head><body>
{body}
</body></html>
"""


def write_captions(out_dir: str | Path) -> list[Path]:
    """One reStructuredText caption per figure under ``out_dir/captions/``."""
    folder = Path(out_dir) / CAPTION_DIR
    return [write_text_atomic(folder / f"{name}.rst", caption[0].upper() + caption[1:] + "\n")
            for name, caption in FIGURE_CAPTIONS.items()]


def write_html(report_md: str | Path) -> Path:
    """``report.md`` rendered as ``report.html`` beside it."""
    from markdown_it import MarkdownIt

    md = Path(report_md)
    body = MarkdownIt("commonmark").enable("table").render(md.read_text())
    title = html.escape(md.read_text().splitlines()[0].lstrip("# ") if md.stat().st_size else "")
    return write_text_atomic(md.with_suffix(".html"), PAGE.format(title=title, body=body))


def write_pages(out_dir: str | Path) -> list[Path]:
    """Every page the Snakemake report takes from ``out_dir`` (after race.analysis.report)."""
    return write_captions(out_dir) + [write_html(Path(out_dir) / "report.md")]
