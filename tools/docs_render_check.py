"""Look at the built docs site as a reader would: serve ``site/`` on 127.0.0.1, open the home page
and two other pages in headless Chromium (Debian's ``chromium``), and check what it rendered:
the navigation, the code blocks and the report picture (the browser fetched it and its page's
DOM holds it), with a screenshot of each page kept for a person to look at.

    python tools/docs_render_check.py site OUT_DIR      # after `make docs`; `make docs-check`

Exit 0 when every page rendered as expected; 1 with the reason otherwise.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import ClassVar

PAGES = {
    "": ["md-nav", "md-typeset", "report-loads.png"],  # home: navigation, the picture
    "getting-started/": ["md-nav", "highlight", "equishard prep"],  # code blocks
    "preparing/vision-policies/": ["md-nav", "<table", "qwen2vl"],  # the policy table
}
# headless Chromium on a machine without a display or network (tests/shards/nightly/test_rebalance.py
# renders the HTML report with the same flags)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Log(http.server.SimpleHTTPRequestHandler):
    served: ClassVar[list[str]] = []  # every request the server answered

    def log_message(self, fmt, *args):  # record each request, do not print it
        self.served.append(f"{args[0]} {args[1]}" if len(args) > 1 else str(args))


def check(site: Path, out: Path) -> list[str]:
    browser = chromium()
    if browser is None:
        return ["no chromium on PATH (Debian: apt-get install chromium)"]
    out.mkdir(parents=True, exist_ok=True)
    handler = functools.partial(_Log, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    problems = []
    try:
        for page, wants in PAGES.items():
            url = base + page
            name = page.strip("/").replace("/", "-") or "index"
            with tempfile.TemporaryDirectory() as profile:
                run = [browser, *FLAGS, "--window-size=1280,1600", f"--user-data-dir={profile}"]
                dom = subprocess.run(
                    [*run, "--dump-dom", url], capture_output=True, text=True, timeout=120
                ).stdout
                shot = out / f"{name}.png"
                subprocess.run(
                    [*run, f"--screenshot={shot}", url], capture_output=True, timeout=120
                )
            for want in wants:
                if want not in dom:
                    problems.append(f"{url}: the rendered page has no {want!r}")
            if not shot.exists() or shot.stat().st_size < 10_000:
                problems.append(f"{url}: no screenshot, or a blank one ({shot})")
        if not any("report-loads.png" in s and s.endswith(" 200") for s in _Log.served):
            problems.append("the browser never fetched assets/report-loads.png")
    finally:
        server.shutdown()
    return problems


def main() -> int:
    site, out = Path(sys.argv[1]), Path(sys.argv[2])
    problems = check(site, out)
    for p in problems:
        print(f"docs-check: {p}", file=sys.stderr)
    if not problems:
        print(f"docs-check: {len(PAGES)} pages rendered in Chromium; screenshots in {out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
