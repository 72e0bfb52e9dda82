"""An index page for a folder of reports: `python -m trainperf.report.index FOLDER`.

`make demo` uses it to write demo/index.html, which links every report the demo made
(each with its title and subtitle, read from the page's head) and the data files beside them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from trainperf.errors import TrainperfError
from trainperf.report.html import Report, esc, paragraph

_HEAD_BYTES = 4096  # title and description sit at the top of the head, before any inlined script


def page_summary(path: Path) -> tuple[str, str]:
    """Return (title, description) of an HTML page, read from its head ('' where absent)."""
    with open(path, "rb") as f:
        head = f.read(_HEAD_BYTES).decode("utf-8", "replace")
    title = re.search(r"<title>(.*?)</title>", head, re.S)
    desc = re.search(r"<meta name='description' content='(.*?)'>", head, re.S)
    import html

    return (html.unescape(title.group(1)).strip() if title else "", html.unescape(desc.group(1)).strip() if desc else "")


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.1f} MiB" if n_bytes >= 2**20 else f"{n_bytes / 2**10:.0f} KiB"


def write_index(folder: str | Path, title: str = "trainperf reports") -> Path:
    """Write ``folder``/index.html linking every HTML report and JSON / CSV file under it; return its path."""
    root = Path(folder)
    if not root.is_dir():
        raise TrainperfError(f"{root}: not a folder")
    pages = sorted(p for p in root.rglob("*.html") if p.name != "index.html" and p.is_file())
    data = sorted(p for ext in ("json", "csv", "jsonl") for p in root.rglob(f"*.{ext}")
                  if p.is_file() and "store" not in p.relative_to(root).parts)
    rep = Report(title, f"{len(pages)} report(s) in {root}; each is one self-contained file that opens offline")
    items = []
    for p in pages:
        t, d = page_summary(p)
        rel = p.relative_to(root).as_posix()
        items.append(f"<li><a href='{esc(rel)}'>{esc(t or rel)}</a> <code>{esc(rel)}</code>"
                     f"{' — ' + esc(d) if d else ''} <span class='note'>({_size(p.stat().st_size)})</span></li>")
    rep.add("Reports", f"<ul>{''.join(items)}</ul>" if items else paragraph("No HTML report in this folder.", "note"))
    if data:
        rows = "".join(f"<li><a href='{esc(p.relative_to(root).as_posix())}'>{esc(p.relative_to(root).as_posix())}</a> "
                       f"<span class='note'>({_size(p.stat().st_size)})</span></li>" for p in data)
        rep.add("Data files", f"<ul>{rows}</ul>")
    return rep.write(root / "index.html")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m trainperf.report.index FOLDER")
    try:
        print(write_index(sys.argv[1]))
    except TrainperfError as e:
        sys.exit(f"error: {e}")
