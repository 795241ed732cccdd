"""Pages for Snakemake's report (``snakemake --report report.zip``), next to reports/.

Snakemake shows images and tables itself, but takes each entry's caption from a file named in
the rule, and does not render Markdown. So ``race report`` also writes:

* ``captions/<figure>.rst`` -- each figure's own caption, from
  :data:`race.analysis.report_markdown.FIGURE_CAPTIONS` (the captions report.md uses: one source);
* ``report/index.html`` -- report.md rendered to HTML (markdown-it, CommonMark with tables), so
  the report's text, tables and figures read inside the Snakemake report, with a copy (a hard
  link where the file system allows) of every local file the page shows or links
  (``report/figures/...``) beside it.

Why a folder: the zip Snakemake writes stores each ``report()`` output in a folder of its own,
``data/raw/<hash of its path>/<name>``, so a lone report.html there finds none of the figures
its relative links name (``figures/frontier.png``). A folder flagged
``report(directory(...), htmlindex="index.html")`` is packed whole, its files at their paths
relative to the index: the page's links resolve in the zip, and in the folder on disk. (A
single-file ``--report report.html`` cannot hold such a folder; Snakemake says to use .zip.)
"""

from __future__ import annotations

import html
import os
import posixpath
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from race.analysis.report_markdown import FIGURE_CAPTIONS
from race.core.atomic import write_text_atomic

CAPTION_DIR = "captions"
#: The page's folder under the reports directory, and its index (what the report rule flags).
PAGE_DIR = "report"
PAGE_INDEX = "index.html"
# Figures scale down to the page (they are ~2,500 px wide); a wide table scrolls inside its own
# box rather than the page (display:block makes the table its own scroll container).
PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.4}}
img{{max-width:100%;height:auto}}
table{{border-collapse:collapse;display:block;max-width:100%;overflow-x:auto}}
td,th{{border:1px solid #ccc;padding:2px 6px}}pre{{overflow-x:auto}}</style>
</head><body>
{body}
</body></html>
"""


def write_captions(out_dir: str | Path) -> list[Path]:
    """One reStructuredText caption per figure under ``out_dir/captions/``."""
    folder = Path(out_dir) / CAPTION_DIR
    return [write_text_atomic(folder / f"{name}.rst", caption[0].upper() + caption[1:] + "\n")
            for name, caption in FIGURE_CAPTIONS.items()]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        for name, value in attrs:
            if value and (tag, name) in (("img", "src"), ("a", "href"), ("link", "href"),
                                          ("script", "src"), ("source", "src")):
                self.links.append(value)


def local_links(page: str) -> list[str]:
    """The relative paths of the local files ``page`` (HTML) shows or links, unquoted, in
    order of appearance: no URL with a scheme (https:, data:, ...), no fragment-only link,
    no absolute path."""
    parser = _Links()
    parser.feed(page)
    out = []
    for link in parser.links:
        parts = urlsplit(link)
        if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
            continue
        out.append(unquote(parts.path))
    return out


def _place(source: Path, target: Path) -> None:
    """``source`` at ``target``: a hard link (no second copy on disk), else a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_html(report_md: str | Path) -> list[Path]:
    """``report.md`` rendered as ``report/index.html`` beside it, with every local file it
    shows or links placed at the same relative path inside ``report/`` (the folder is
    rewritten whole: a file a previous page linked does not stay)."""
    from markdown_it import MarkdownIt

    md = Path(report_md)
    text = md.read_text()
    body = MarkdownIt("commonmark").enable("table").render(text)
    title = html.escape(text.splitlines()[0].lstrip("# ") if text else "")
    folder = md.parent / PAGE_DIR
    if folder.is_dir():
        shutil.rmtree(folder)
    written = []
    for rel in dict.fromkeys(local_links(body)):
        norm = posixpath.normpath(rel)
        source = md.parent / norm
        if norm.startswith("../") or norm == ".." or not source.is_file():
            raise ValueError(f"{md.name} links {rel}, which is not a file in {md.parent}")
        _place(source, folder / norm)
        written.append(folder / norm)
    index = write_text_atomic(folder / PAGE_INDEX, PAGE.format(title=title, body=body))
    return [index, *written]


def write_pages(out_dir: str | Path) -> list[Path]:
    """Every page the Snakemake report takes from ``out_dir`` (after race.analysis.report)."""
    return write_captions(out_dir) + write_html(Path(out_dir) / "report.md")
