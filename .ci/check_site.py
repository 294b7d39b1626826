"""Browser test of the built book: every page of ``_build/html`` opened in headless Chromium.

    python .ci/check_site.py _build/html --screenshots _build/screenshots

For every page (Sphinx's genindex / search / module index and the ``_static`` / ``_sources`` / ...
folders excepted) it checks that

- the page loads with no console error (Chrome's browser log at level SEVERE: uncaught exceptions,
  ``console.error`` calls, resources that fail to load);
- every ``<img>`` has loaded (``complete`` and ``naturalWidth > 0``);
- MathJax typeset every formula: no ``merror`` (a TeX error), no undefined macro (MathJax shows
  those in red instead of failing), no ``.math`` element left untypeset, and no raw TeX
  (``\\(``, ``\\[``, ``$$``, ``$x^2$``) in the text outside code;
- no Markdown leaked into the text: a MyST role (``{glue:text}`...```, ``{numref}``, ``{cite:p}``),
  a ``:::`` or ````` ``` ````` fence, a stray backtick, or a pipe table that became a paragraph;
- the page does not scroll sideways (content wider than the window), and no table, caption or
  figure is wider than the text column (a table that only fits inside a scroll box, a caption whose
  line ends are cut at the column's edge): checked at a laptop width (1400 px) and again, for these
  two layout checks only, at a phone's width (a 390 px viewport); ``--widths`` sets them;
- the edit and issue buttons are on the page and point at the repository (``--repository``);
- where the site has a ``versions.json`` at its root (book/_ext/version_switcher.py writes one),
  every page of the book's theme has the version switcher and its menu lists at least one version
  (read from that file through the local server: no network);
- every figure has a number (``span.caption-number``) and a caption, and every image a notebook
  printed (``div.cell_output img``) sits in such a figure, except the precomputed slider widgets
  (``div.deqlab-explorer``);

then takes a full-page screenshot of it into ``--screenshots`` (named after the page path). The
search page is checked on its own: ``search.html?q=TERM`` must list results for each
``--search-terms`` term.

The site is served by a local HTTP server (as on GitHub Pages; ``file://`` pages cannot load the
MathJax fonts) and nothing else is reached: a page that needs the network fails. The browser is
the system Chromium driven by Selenium through the system chromedriver (Debian: ``apt-get install
chromium chromium-driver``); nothing is downloaded at run time.

Prints every problem as ``page: element: problem`` and exits 1 if there is any, 2 on bad usage (no
such folder, no browser).
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CHROMIUM = "/usr/bin/chromium"
DEFAULT_CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL_HINT = "install them with: apt-get install chromium chromium-driver (Debian / Ubuntu)"

# Pages Sphinx generates that have no content of ours (search.html is checked by searching).
GENERATED_PAGES = {"genindex.html", "search.html", "py-modindex.html"}

# Console messages that are not defects of the site, by exact text (the server address replaced
# by "SITE/"). Add an entry only with a comment saying why it is harmless.
CONSOLE_WHITELIST = {
    # Chromium asks every origin for /favicon.ico by itself when a page declares no icon (the book
    # declares none); the request is the browser's, not the site's. It is logged once per run.
    "SITE/favicon.ico - Failed to load resource: the server responded with a status of 404 (File not found)",
}

PAGE_LOAD_TIMEOUT_S = 60
MATHJAX_TIMEOUT_S = 60
SEARCH_TIMEOUT_S = 30
WINDOW_WIDTH, WINDOW_HEIGHT = 1400, 1000
PHONE_HEIGHT = 844  # the height of the mobile emulation (an iPhone 12-14's 390 x 844 CSS pixels)
DEFAULT_WIDTHS = "1400,390"
MAX_SCREENSHOT_HEIGHT = 60000  # px; the API reference is the longest page (about 55 000)


@dataclass(frozen=True)
class Problem:
    page: str
    element: str
    problem: str

    def __str__(self) -> str:
        return f"{self.page}: {self.element}: {self.problem}"


# Waits for the images (lazy ones are made eager), MathJax's first typesetting and the web fonts.
# Resolves with {"mathjax": "absent" | "ok" | "not started" | "failed: ...", "images": bool}.
WAIT_FOR_PAGE_JS = r"""
const done = arguments[arguments.length - 1];
const timeoutMs = arguments[0];
const result = {mathjax: "absent", images: false};
const timer = setTimeout(() => { result.timeout = true; done(result); }, timeoutMs);
const images = Array.from(document.images);
images.forEach((img) => { if (img.loading === "lazy") img.loading = "eager"; });
const imagesSettled = Promise.all(images.map((img) => img.complete ? Promise.resolve() :
  new Promise((resolve) => {
    img.addEventListener("load", resolve, {once: true});
    img.addEventListener("error", resolve, {once: true});
  }))).then(() => { result.images = true; });
let mathjax = Promise.resolve();
if (window.MathJax !== undefined) {
  // Before MathJax's loader has run, window.MathJax is only the configuration object.
  if (window.MathJax.startup && window.MathJax.startup.promise) {
    mathjax = window.MathJax.startup.promise.then(
      () => { result.mathjax = "ok"; },
      (error) => { result.mathjax = "failed: " + error; });
  } else {
    result.mathjax = "not started";
  }
}
Promise.all([imagesSettled, mathjax]).then(() => document.fonts.ready).then(() => {
  clearTimeout(timer);
  done(result);
});
"""

# Shared by the two audits below: the list of problems and how an element is named.
AUDIT_PRELUDE = r"""
const problems = [];
const report = (element, problem) => problems.push([element, problem]);
const snippet = (text) => JSON.stringify(text.replace(/\s+/g, " ").trim().slice(0, 70));

function describe(el) {
  let name = el.tagName.toLowerCase();
  if (el.id) name += "#" + el.id;
  else if (el.classList.length) name += "." + Array.from(el.classList).slice(0, 2).join(".");
  const section = el.parentElement && el.parentElement.closest("section[id], div.section[id]");
  if (section) name += " in section #" + section.id;
  return name;
}
function describeImage(img) {
  const src = img.getAttribute("src") || "";
  const shown = src.startsWith("data:") ? src.slice(0, 30) + "..." : src;
  return "img[src=" + JSON.stringify(shown) + "]" + describe(img).replace(/^img[^ ]*/, "");
}

// Text we read: not code, not scripts, not typeset maths, not the .math elements (checked below).
const SKIP = "pre, code, kbd, samp, script, style, textarea, noscript, svg, .highlight, "
  + "mjx-container, mjx-assistive-mml, .math";
const BLOCK = "p, li, dt, dd, td, th, h1, h2, h3, h4, h5, h6, caption, figcaption, blockquote, "
  + "div, section, article, main, body";

"""

# Returns [[element, problem], ...] for everything wrong in the rendered DOM that does not depend
# on the window's width (images, MathJax, leaked Markdown, figures).
CONTENT_JS = AUDIT_PRELUDE + r"""
// Images.
for (const img of document.images) {
  if (!img.complete || img.naturalWidth === 0) report(describeImage(img), "image did not load");
}

// MathJax: errors and undefined macros, from MathJax's own list of typeset formulas.
const mj = window.MathJax;
const typesetItems = (mj && mj.startup && mj.startup.document && mj.startup.document.math)
  ? Array.from(mj.startup.document.math) : [];
for (const item of typesetItems) {
  let mml = "";
  try { mml = mj.startup.toMML(item.root); } catch (error) { mml = ""; }
  const where = item.start && item.start.node && item.start.node.parentElement
    ? describe(item.start.node.parentElement) : "formula";
  const tex = JSON.stringify(String(item.math).slice(0, 70));
  const errorNode = item.typesetRoot && item.typesetRoot.querySelector("mjx-merror");
  if (errorNode || mml.includes("<merror")) {
    const message = errorNode ? errorNode.getAttribute("data-mjx-error") : "";
    report(where + " formula " + tex, "MathJax error" + (message ? ": " + message : ""));
  }
  // MathJax's noundefined extension typesets an unknown \macro as its name in red.
  const undefinedMacro = mml.match(/<mtext mathcolor="red">(\\[A-Za-z]+)<\/mtext>/);
  if (undefinedMacro) {
    report(where + " formula " + tex, "MathJax: undefined macro " + undefinedMacro[1]);
  }
}
// Any MathJax error element the list above did not cover (a formula typeset later, elsewhere).
const listed = new Set(typesetItems.map((item) => item.typesetRoot));
for (const errorNode of document.querySelectorAll("mjx-merror")) {
  const container = errorNode.closest("mjx-container");
  if (listed.has(container)) continue;
  report(describe(container || errorNode),
    "MathJax error: " + (errorNode.getAttribute("data-mjx-error") || "(no message)"));
}
for (const el of document.querySelectorAll(".math")) {
  if (!el.querySelector("mjx-container")) {
    report(describe(el) + " " + snippet(el.textContent), "formula not typeset by MathJax");
  }
}

// Leaked Markdown and raw TeX in the text.
const ROLE = /\{(glue|numref|ref|eq|cite|doc|term|math|download|abbr)(:[a-z]*)?\}`?/;
const RAW_TEX = /\\\(|\\\)|\\\[|\\\]|\$\$|\\begin\{|\$[^$\s][^$\n]*?[\\^_][^$\n]*?\$/;
const PIPE_ROW = /^\s*\|.*\|\s*$/m;
const PIPE_RULE = /\|\s*:?-{3,}:?\s*\|/;
const blocks = new Set();
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  const parent = node.parentElement;
  if (!parent || parent.closest(SKIP) || !node.textContent.trim()) continue;
  blocks.add(parent.closest(BLOCK) || parent);
}
for (const block of blocks) {
  // The block's own text, without its descendant blocks (those are checked themselves) and
  // without skipped parts.
  let text = "";
  const inner = document.createTreeWalker(block, NodeFilter.SHOW_TEXT);
  for (let node = inner.nextNode(); node; node = inner.nextNode()) {
    const parent = node.parentElement;
    if (parent.closest(SKIP) || (parent.closest(BLOCK) || parent) !== block) continue;
    text += node.textContent;
  }
  if (!text.trim()) continue;
  const name = describe(block);
  const role = text.match(ROLE);
  if (role) report(name + " " + snippet(text), "leaked Markdown: MyST role " + role[0]);
  if (text.includes(":::")) report(name + " " + snippet(text), "leaked Markdown: ::: fence");
  if (text.includes("```")) report(name + " " + snippet(text), "leaked Markdown: ``` fence");
  // Outside code, a backtick is Markdown that was not parsed (inline code, a role, a fence).
  else if (text.includes("`") && !role) report(name + " " + snippet(text), "leaked Markdown: backtick");
  if (PIPE_RULE.test(text) || PIPE_ROW.test(text)) {
    report(name + " " + snippet(text), "leaked Markdown: pipe table rendered as text");
  }
  const tex = text.match(RAW_TEX);
  if (tex) report(name + " " + snippet(text), "raw TeX not typeset: " + JSON.stringify(tex[0]));
}

// Figures: a number and a caption; notebook output images inside such a figure.
const numberedFigure = (fig) => {
  const number = fig.querySelector(".caption-number");
  const caption = fig.querySelector(".caption-text");
  return Boolean(number && number.textContent.trim() && caption && caption.textContent.trim());
};
for (const fig of document.querySelectorAll("figure, div.figure")) {
  if (numberedFigure(fig)) continue;
  const img = fig.querySelector("img");
  const name = describe(fig) + (img ? " with " + describeImage(img).split(" in section")[0] : "");
  const number = fig.querySelector(".caption-number");
  report(name, number && number.textContent.trim() ? "figure without caption text"
    : "figure without a number and caption");
}
for (const img of document.querySelectorAll("div.cell_output img")) {
  if (img.closest("div.deqlab-explorer")) continue;
  const fig = img.closest("figure, div.figure");
  if (!fig) report(describeImage(img), "notebook output image outside a numbered figure");
}
return problems;
"""

# Returns [[element, problem], ...] for the layout at the current width: elements wider than the
# text column, a page that scrolls sideways.
LAYOUT_JS = AUDIT_PRELUDE + r"""
// Layout: no table, caption or figure wider than the text column. A table in a scroll box still
// fails: its last columns are hidden until the reader scrolls (and a caption in that box is cut at
// the column's edge). The column is the article (Sphinx Book Theme) or <main>.
const column = document.querySelector("article.bd-article") || document.querySelector("main")
  || document.body;
const columnBox = column.getBoundingClientRect();
const columnStyle = getComputedStyle(column);
const columnLeft = columnBox.left + parseFloat(columnStyle.paddingLeft || "0");
const columnRight = columnBox.right - parseFloat(columnStyle.paddingRight || "0");
const columnWidth = Math.round(columnRight - columnLeft);
const hidden = (el) => el.getClientRects().length === 0;
const wideElements = Array.from(column.querySelectorAll(
  "table, figure, div.figure, figcaption, caption, div.caption, span.caption-text"));
for (const el of wideElements) {
  if (hidden(el) || el.closest("pre, .highlight, mjx-container, div.deqlab-explorer")) continue;
  // Only the outermost offender: a figure that is too wide because its table is, names the table.
  const box = el.getBoundingClientRect();
  const overflowsOwnBox = el.tagName !== "TABLE" && el.scrollWidth > el.clientWidth + 2
    && el.clientWidth > 0;
  const pastColumn = box.right > columnRight + 2 || box.left < columnLeft - 2;
  if (!overflowsOwnBox && !pastColumn) continue;
  const innerOffender = Array.from(el.querySelectorAll(wideElements.map((e) => e.tagName).join(",")))
    .some((inner) => inner !== el && !hidden(inner) && inner.getBoundingClientRect().right > columnRight + 2);
  if (innerOffender && el.tagName !== "TABLE") continue;
  const width = Math.round(Math.max(box.width, el.scrollWidth));
  report(describe(el) + " " + snippet(el.textContent),
    el.tagName.toLowerCase() + " is " + width + " px wide in a " + columnWidth
    + " px text column (" + document.documentElement.clientWidth + " px window): content wider than its box");
}

// Layout: the page must not scroll sideways (wide content scrolls in its own box). Named: the
// outermost elements that stick out on the right, outside any box that clips or scrolls them.
const viewport = document.documentElement.clientWidth;
if (document.documentElement.scrollWidth > viewport + 2) {
  const clipped = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (["auto", "scroll", "hidden", "clip"].includes(getComputedStyle(a).overflowX)) return true;
    }
    return false;
  };
  // An element is too wide when its box reaches past the window or its content overflows its box
  // (a line that cannot wrap); the culprits are the deepest such elements.
  const tooWide = (el) => el.getBoundingClientRect().right > viewport + 2
    || (el.scrollWidth > el.clientWidth + 2 && getComputedStyle(el).overflowX === "visible");
  const culprits = Array.from(document.body.querySelectorAll("*"))
    .filter((el) => tooWide(el) && !clipped(el) && !Array.from(el.children).some(tooWide));
  report(culprits.slice(0, 3).map(describe).join(", ") || "page",
    "page is " + document.documentElement.scrollWidth + " px wide in a " + viewport
    + " px window (it scrolls sideways)");
}

return problems;
"""

SEARCH_STATUS_JS = r"""
const results = document.querySelectorAll("#search-results ul.search li");
const box = document.querySelector("#search-results");
return [results.length, box ? box.innerText : null];
"""


def page_label(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def pages_of(root: Path) -> list[Path]:
    """Every content page of the build: no generated index/search pages, no _static/_sources/..."""
    pages = []
    for path in sorted(root.rglob("*.html")):
        relative = path.relative_to(root)
        if any(part.startswith((".", "_")) for part in relative.parts[:-1]):
            continue
        if relative.as_posix() in GENERATED_PAGES:
            continue
        pages.append(path)
    return pages


def screenshot_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "__", label.removesuffix(".html")) + ".png"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the signature of the base class
        pass  # the browser log reports failed requests; the access log would only be noise


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def start_browser(chromium: str, chromedriver: str):
    missing = [p for p in (chromium, chromedriver) if shutil.which(p) is None]
    if missing:
        raise SystemExit(f"check_site: not found: {', '.join(missing)}; {INSTALL_HINT}")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as error:
        raise SystemExit(
            f"check_site: selenium is not installed ({error}); pip install -e '.[test]'"
        ) from error
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which(chromium)
    for flag in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",  # small /dev/shm in containers
        "--disable-gpu",
        f"--window-size={WINDOW_WIDTH},{WINDOW_HEIGHT}",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",  # no update checks or other traffic of its own
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager (which would download a driver) is not used.
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which(chromedriver)), options=options)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    driver.set_script_timeout(MATHJAX_TIMEOUT_S + 10)
    return driver


def console_errors(driver, base_url: str) -> list[str]:
    errors = []
    for entry in driver.get_log("browser"):
        if entry.get("level") != "SEVERE":
            continue
        message = entry.get("message", "").replace(base_url, "SITE/")
        if message not in CONSOLE_WHITELIST:
            errors.append(message)
    return errors


def full_page_screenshot(driver, path: Path) -> None:
    """The whole page as the window shows it: the window is made as tall as the page for the shot.

    (Chrome's own full-page capture, captureBeyondViewport, lays the theme out differently: the
    sidebars vanish and the article slides off the left edge.) Pages taller than
    MAX_SCREENSHOT_HEIGHT are cut there.
    """
    height = min(int(driver.execute_script("return document.documentElement.scrollHeight")), MAX_SCREENSHOT_HEIGHT)
    metrics = {"width": WINDOW_WIDTH, "height": max(height, WINDOW_HEIGHT), "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path.write_bytes(base64.b64decode(shot["data"]))


BUTTONS_JS = r"""
const repository = arguments[0];
const header = document.querySelector(".article-header-buttons, .header-article-items__end");
if (!header) return null;  // not a page of the book's theme (fixtures, redirects)
const links = Array.from(document.querySelectorAll("a[href]")).map((a) => a.getAttribute("href"));
return {
  edit: links.some((href) => href.startsWith(repository + "/edit/")),
  issue: links.some((href) => href.startsWith(repository + "/issues/new")),
};
"""


SWITCHER_JS = r"""
const done = arguments[arguments.length - 1];
const header = document.querySelector(".article-header-buttons, .header-article-items__end");
if (!header) { done(null); return; }  // not a page of the book's theme (fixtures, redirects)
const started = Date.now();
(function poll() {
  const button = document.querySelector(".version-switcher__button");
  const entries = document.querySelectorAll(".version-switcher__menu a, .version-switcher__menu .list-group-item");
  if (button && entries.length > 0) { done({button: true, entries: entries.length}); return; }
  if (Date.now() - started > arguments_timeout) { done({button: !!button, entries: entries.length}); return; }
  setTimeout(poll, 100);
})();
""".replace("arguments_timeout", "10000")


def check_switcher(driver, label: str) -> list[Problem]:
    """The version switcher is on the page and lists the versions of versions.json."""
    state = driver.execute_async_script(SWITCHER_JS)
    if state is None:
        return []
    if not state["button"]:
        return [Problem(label, "version switcher", "missing (no .version-switcher__button)")]
    if state["entries"] == 0:
        return [Problem(label, "version switcher", "lists no version (versions.json not read?)")]
    return []


def wait_for_page(driver, label: str) -> list[Problem]:
    """Waits for images, MathJax and fonts; the problems if they did not settle."""
    problems = []
    state = driver.execute_async_script(WAIT_FOR_PAGE_JS, MATHJAX_TIMEOUT_S * 1000)
    if state.get("timeout"):
        problems.append(
            Problem(label, "page", f"images / MathJax / fonts not settled after {MATHJAX_TIMEOUT_S} s: {state}")
        )
    if state["mathjax"] not in ("ok", "absent"):
        problems.append(Problem(label, "MathJax", f"did not typeset the page: {state['mathjax']}"))
    return problems


def emulate_width(driver, width: int | None) -> None:
    """A viewport ``width`` CSS px wide (a phone's width), or the window back (None).

    Not Chrome's mobile emulation: that lays out a page without a viewport ``<meta>`` at 980 px;
    the book's theme declares ``width=device-width``, so a phone shows it at its own width, as here.
    """
    if width is None:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    else:
        metrics = {"width": width, "height": PHONE_HEIGHT, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)


def check_page(driver, base_url: str, root: Path, path: Path, screenshots: Path | None,
               widths: tuple[int, ...] = (WINDOW_WIDTH,), repository: str | None = None) -> list[Problem]:
    """Every check of one page: at the window's width, then the layout checks at the other widths."""
    label = page_label(path, root)
    url = base_url + label
    problems: list[Problem] = []
    console_errors(driver, base_url)  # drop what an earlier page logged late (already counted)
    try:
        driver.get(url)
    except Exception as error:  # selenium's TimeoutException and WebDriverException alike
        return [Problem(label, "page", f"did not load: {type(error).__name__}: {error}".strip())]
    if driver.current_url.split("#")[0] != url:
        # Jupyter Book's root index.html only redirects to the first page, which is checked itself.
        target = driver.current_url.split("#")[0]
        if not target.startswith(base_url) or not (root / target.removeprefix(base_url)).is_file():
            problems.append(Problem(label, "page", f"redirects to {target}, which is not a page of the site"))
        return problems
    problems += wait_for_page(driver, label)
    for element, problem in driver.execute_script(CONTENT_JS):
        problems.append(Problem(label, element, problem))
    if repository:
        buttons = driver.execute_script(BUTTONS_JS, repository.rstrip("/"))
        if buttons is not None:
            for kind, where in (("edit", "/edit/<branch>/<page>"), ("issue", "/issues/new")):
                if not buttons[kind]:
                    problems.append(Problem(label, f"{kind} button", f"no link to {repository.rstrip('/')}{where}"))
    if (root / "versions.json").is_file():
        problems += check_switcher(driver, label)
    # Console messages now: the reloads at other widths would log the same ones again.
    problems += [Problem(label, "console", message) for message in console_errors(driver, base_url)]
    for width in widths:
        phone = None if width == WINDOW_WIDTH else width
        if phone is not None:
            emulate_width(driver, phone)
            try:
                driver.get(url)
                problems += wait_for_page(driver, label)
            except Exception as error:
                emulate_width(driver, None)
                problems.append(Problem(label, "page", f"did not load at {width} px: {type(error).__name__}"))
                continue
        try:
            for element, problem in driver.execute_script(LAYOUT_JS):
                problems.append(Problem(label, element, problem))
        finally:
            if phone is not None:
                emulate_width(driver, None)
    if screenshots is not None:
        if any(width != WINDOW_WIDTH for width in widths):
            driver.get(url)  # back to the window's own width for the screenshot
            wait_for_page(driver, label)
        full_page_screenshot(driver, screenshots / screenshot_name(label))
    return problems


def check_search(driver, base_url: str, root: Path, terms: list[str]) -> list[Problem]:
    if not (root / "search.html").is_file():
        return [Problem("search.html", "page", "missing: the site has no search page")]
    problems = []
    for term in terms:
        label = f"search.html?q={term}"
        console_errors(driver, base_url)
        driver.get(base_url + label)
        deadline = time.monotonic() + SEARCH_TIMEOUT_S
        count, text = 0, None
        while time.monotonic() < deadline:
            count, text = driver.execute_script(SEARCH_STATUS_JS)
            if count or (text and ("Search finished" in text or "did not match" in text)):
                break
            time.sleep(0.2)
        if not count:
            status = " ".join((text or "no #search-results element").split())[:120]
            problems.append(Problem(label, "#search-results", f"no results for {term!r} ({status})"))
        for message in console_errors(driver, base_url):
            problems.append(Problem(label, "console", message))
    return problems


def configured_repository(site: Path) -> str | None:
    """``repository.url`` of the book's ``_config.yml`` (the folder above ``_build/html``), or None."""
    for folder in site.parents:
        config = folder / "_config.yml"
        if config.is_file():
            match = re.search(r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", config.read_text(), re.M)
            return match.group(1).strip("'\"") if match else None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built site, e.g. _build/html")
    parser.add_argument("--screenshots", type=Path, help="folder for a full-page screenshot per page")
    parser.add_argument(
        "--search-terms",
        default="equilibrium,Anderson",
        help="comma-separated terms search.html must find (default: %(default)s; '' checks no search)",
    )
    # Elsewhere (e.g. a GitHub runner's preinstalled Chrome): --chromium / $CHROMIUM and
    # --chromedriver / $CHROMEDRIVER; the two must be of the same major version.
    parser.add_argument(
        "--widths",
        default=DEFAULT_WIDTHS,
        help=f"comma-separated widths in CSS px for the layout checks (default: %(default)s; "
        f"{WINDOW_WIDTH} is the window, any other a viewport of that width)",
    )
    parser.add_argument(
        "--repository",
        default=None,
        help="the repository URL the edit and issue buttons must point at (default: repository.url "
        "of the _config.yml next to the site's book, if found; '' checks no buttons)",
    )
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", DEFAULT_CHROMIUM))
    parser.add_argument("--chromedriver", default=os.environ.get("CHROMEDRIVER", DEFAULT_CHROMEDRIVER))
    args = parser.parse_args(argv)

    root = args.site.resolve()
    if not root.is_dir():
        print(f"check_site: {args.site} is not a folder (build the book first: make book)", file=sys.stderr)
        return 2
    pages = pages_of(root)
    if not pages:
        print(f"check_site: no .html pages in {args.site}", file=sys.stderr)
        return 2
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    terms = [term.strip() for term in args.search_terms.split(",") if term.strip()]
    try:
        widths = tuple(int(width) for width in args.widths.split(",") if width.strip())
    except ValueError:
        widths = ()
    if not widths or any(not 200 <= width <= 4000 for width in widths):
        print(f"check_site: --widths must be comma-separated integers in [200, 4000], got {args.widths!r}",
              file=sys.stderr)
        return 2
    repository = args.repository if args.repository is not None else configured_repository(root)

    start = time.monotonic()
    server, base_url = serve(root)
    try:
        driver = start_browser(args.chromium, args.chromedriver)
    except SystemExit as error:
        server.shutdown()
        print(error, file=sys.stderr)
        return 2
    problems: list[Problem] = []
    try:
        for path in pages:
            page_start = time.monotonic()
            found = check_page(driver, base_url, root, path, args.screenshots, widths, repository)
            problems += found
            print(
                f"[site] {page_label(path, root)}: {len(found)} problem(s), {time.monotonic() - page_start:.1f}s",
                flush=True,
            )
        problems += check_search(driver, base_url, root, terms)
    finally:
        driver.quit()
        server.shutdown()

    took = time.monotonic() - start
    if problems:
        print(f"\n{len(problems)} problem(s) on the site:")
        for problem in problems:
            print(f"  {problem}")
    shots = f"; screenshots in {args.screenshots}" if args.screenshots is not None else ""
    print(
        f"[site] {len(pages)} pages at {'/'.join(map(str, widths))} px, {len(terms)} searches checked in {took:.0f}s: "
        f"{len(problems)} problem(s){shots}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
