"""The HTML pages in a real browser: headless Chromium renders report.html and comparison.html.

The layout test renders the unimodal, cross-modal and comparison pages at 1,400 and 500 px and checks in the page
that no text is clipped, outside its box or smaller than 9 px (figures: their smallest text as shown), and, at
1,400 px, that no table is wider than its column.

A copy of each page gets a small probe script (the pages themselves have no script) that records,
after the load event, how many images decoded and what the tables hold; Chromium's --dump-dom
returns the DOM with those records. Skipped, saying why, where Chromium is not installed
(.ci/run installs Debian's chromium package).
"""

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from hashdist.api import compare, evaluate_local

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=10000"]
PROBE = """<script>
window.addEventListener('load', () => {
  const images = [...document.images];
  const probe = document.createElement('pre');
  probe.id = 'probe';
  probe.textContent = JSON.stringify({
    images: images.length,
    decoded: images.filter(i => i.complete && i.naturalWidth > 0).length,
    captions: [...document.querySelectorAll('figure')].map(f => f.querySelector('figcaption')?.textContent || ''),
    tables: [...document.querySelectorAll('table')].map(t => ({
      caption: t.caption ? t.caption.textContent : '',
      header: [...t.querySelectorAll('thead th')].map(c => c.textContent),
      rows: [...t.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.textContent)),
    })),
    definitions: [...document.querySelectorAll('dl dt')].map(t => [t.textContent, t.nextElementSibling.textContent]),
    title: document.title,
    headline: document.querySelector('.headline')?.textContent || '',
    alts: images.map(i => i.alt),
    width: document.documentElement.scrollWidth,
    viewport: document.documentElement.clientWidth,
  });
  document.body.appendChild(probe);
});
</script>"""

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium); "
                                "the HTML pages were not checked in a browser")


class _Probe(HTMLParser):
    def __init__(self):
        super().__init__()
        self.inside, self.text = False, ""

    def handle_starttag(self, tag, attrs):
        self.inside = self.inside or dict(attrs).get("id") == "probe"

    def handle_data(self, data):
        if self.inside:
            self.text += data

    def handle_endtag(self, tag):
        if tag == "pre":
            self.inside = False


LAYOUT_PROBE = """<script>
window.addEventListener('load', () => {
  const problems = [], viewport = document.documentElement.clientWidth;
  const describe = el =>
    `${el.tagName.toLowerCase()}${el.id ? '#' + el.id : ''} "${el.textContent.trim().slice(0, 50)}"`;
  const ownText = el => [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
  for (const el of document.body.querySelectorAll('*')) {
    const style = getComputedStyle(el);
    if (ownText(el) && parseFloat(style.fontSize) < 9) problems.push(`${describe(el)}: ${style.fontSize} text`);
    const hides = ['hidden', 'clip'].includes(style.overflowX) || style.textOverflow === 'ellipsis';
    if (hides && el.scrollWidth > el.clientWidth + 1) problems.push(`${describe(el)}: clipped`);
  }
  // running text must lie inside the window, or inside the scroll box it is in
  for (const el of document.querySelectorAll('h1, h2, h3, p, li, caption, figcaption, dt, dd')) {
    const range = document.createRange();
    range.selectNodeContents(el);
    const text = range.getBoundingClientRect(), box = el.closest('.scroll, .plot');
    const right = box ? Math.min(box.getBoundingClientRect().right, viewport) : viewport;
    if (text.width && (text.right > right + 1 || text.left < -1))
      problems.push(`${describe(el)}: text from ${text.left} to ${text.right}, box ends at ${right}`);
  }
  for (const img of document.images) {
    const shown = img.getBoundingClientRect().width / img.naturalWidth * parseFloat(img.dataset.minTextPx);
    if (!(shown >= 9)) problems.push(`figure ${img.closest('figure').id}: smallest text shown at ${shown} px`);
  }
  for (const text of document.querySelectorAll('svg text')) {
    if (text.getBoundingClientRect().height < 9) problems.push(`${describe(text)}: SVG text under 9 px`);
  }
  const probe = document.createElement('pre');
  probe.id = 'probe';
  probe.textContent = JSON.stringify({
    problems, viewport, width: document.documentElement.scrollWidth,
    tables: [...document.querySelectorAll('table')].map(t => ({
      caption: t.caption ? t.caption.textContent : '', width: t.getBoundingClientRect().width,
      column: document.body.clientWidth - parseFloat(getComputedStyle(document.body).paddingLeft)
        - parseFloat(getComputedStyle(document.body).paddingRight)})),
  });
  document.body.appendChild(probe);
});
</script>"""


def rendered(page, tmp_path, width: int = 1400, probe: str = PROBE, screenshot=None) -> dict:
    """What Chromium made of ``page`` in a window ``width`` pixels wide: image counts and alt texts, figure
    captions, the headline and the tables' cells (or what ``probe`` records); ``screenshot``: also a PNG of the
    window's first 2,400 px there."""
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", probe + "</body>"))
    if screenshot is not None:
        subprocess.run([CHROMIUM, *FLAGS, "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
                        f"--window-size={width},2400", f"--screenshot={screenshot}", page.as_uri()],
                       capture_output=True, timeout=120, check=True)
    done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},900",
                           "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    parser = _Probe()
    parser.feed(done.stdout)
    assert parser.text, "the page did not finish loading in Chromium"
    return json.loads(parser.text)


def _table(view, caption_start):
    [table] = [t for t in view["tables"] if t["caption"].startswith(caption_start)]
    return table


def test_report_page_in_chromium(multilabel_dataset, tmp_path):
    ev = evaluate_local(multilabel_dataset, cache=False, k=[5, 50], hashtable=["8x2"])
    out = ev.write(tmp_path / "report")
    view = rendered(out / "report.html", tmp_path)
    assert view["images"] == view["decoded"] == 7
    assert all(len(caption) > 60 for caption in view["captions"]), view["captions"]  # says what and which convention
    ranked = _table(view, "Ranking by Hamming distance")
    assert ranked["header"] == ["metric", "expected", "best", "worst"]
    rows = {row[0]: row[1:] for row in ranked["rows"]}
    m = ev.report["metrics"]
    assert rows["mAP"] == [f"{m['map'][p]:.4f}" for p in ("expected", "best", "worst")]
    assert rows["mAP@50 (total)"] == [f"{m['map_at_k']['50']['total'][p]:.4f}" for p in ("expected", "best", "worst")]
    radius = _table(view, "Retrieval within Hamming radius")
    assert [row[0] for row in radius["rows"]] == ["0", "1", "2"]
    assert radius["header"][-2:] == ["mLGAP", "empty queries"]
    assert _table(view, "Hashtable-bucket paradigm")["rows"][0][0] == "8x2"
    # every measure of the page, defined under its label's pattern
    terms = dict(view["definitions"])
    assert list(terms) == ["mAP", "mAP@K", "P@K", "R@K", "NDCG@K", "NDCG-SH@K", "P@N", "R@N", "PR curve by rank",
                           "AUC", "P@r (macro)", "R@r (macro)", "micro@r", "mAP@r", "mLGAP@r", "empty@r", "PR curve",
                           "AUPRC", "hashtable KxL"]
    assert "min(K, R)" in terms["mAP@K"] and "2^g - 1" in terms["NDCG@K"] and "L" in terms["hashtable KxL"]
    assert "http" not in re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", (out / "report.html").read_text())


def test_report_page_leads_with_its_headline_and_shows_its_provenance(multilabel_dataset, tmp_path):
    ev = evaluate_local(multilabel_dataset, cache=False, k=[5, 50])
    out = ev.write(tmp_path / "report")
    r = ev.report
    for width in (1400, 400):
        view = rendered(out / "report.html", tmp_path, width)
        assert view["title"] == "hashdist report: data.zarr"
        m = r["metrics"]["map"]
        assert (f"mAP {m['expected']:.4f}: any order of tied items gives {m['worst']:.4f} to {m['best']:.4f}; "
                f"publish {m['expected']:.4f}, the expected value") in view["headline"]
        assert f"{r['dataset']['n_queries']:,} queries x {r['dataset']['n_database']:,} database items" in \
            view["headline"]
        provenance = {row[0]: row[1] for row in _table(view, "What made these numbers")["rows"]}
        assert provenance["dataset fingerprint"] == r["dataset"]["fingerprint"]
        assert provenance["hashdist"].startswith(r["provenance"]["packages"]["hashdist"])
        assert provenance["parameter k"] == "[5, 50]" and provenance["created"] == r["provenance"]["created"]
        assert len(view["alts"]) == view["images"] and all(len(alt) > 60 for alt in view["alts"])
        # nothing wider than the window (headless Chromium's narrowest is 500 px): wide tables scroll in a box
        assert view["width"] <= view["viewport"] <= max(width, 500)


def test_comparison_page_in_chromium(class_dataset, tmp_path):
    out = tmp_path / "cmp"
    c = compare([f"a={class_dataset}", f"b={class_dataset}"], cache=False, permutations=99, bootstrap=50, out=out)
    view = rendered(out / "comparison.html", tmp_path)
    assert view["images"] == view["decoded"] == 3  # PR curves, occupancy, bit balance (no second bit length)
    assert all(len(caption) > 60 for caption in view["captions"])
    board = _table(view, "Methods by expected mAP")
    assert [row[0].split()[0] for row in board["rows"]] == c["ranking"]
    assert board["header"][:3] == ["method", "bits", "mAP [worst, best]"]
    assert len(_table(view, "Paired tests")["rows"]) == 2  # ap and lgap for the one pair
    assert len(_table(view, "How each method's database codes")["rows"]) == 2


def _cross_modal_dataset(directory):
    from hashdist.data.synth import PRESETS, synth_dataset

    path = directory / "mirflickr.zarr"
    synth_dataset(str(path), seed=0, **{**PRESETS["mirflickr25k-xm"], "n_database": 1500, "n_queries": 150})
    return path


@pytest.fixture(scope="module")
def three_pages(tmp_path_factory, multilabel_dataset, class_dataset):
    """The unimodal report, the cross-modal report and a comparison of two code lengths, as written."""
    tmp = tmp_path_factory.mktemp("pages")
    unimodal = evaluate_local(multilabel_dataset, cache=False, k=[5, 50]).write(tmp / "report")
    cross = evaluate_local(_cross_modal_dataset(tmp), cache=False).write(tmp / "cross")
    compare([f"method-a={class_dataset}", f"method-b@12={class_dataset}"], cache=False, permutations=99,
            bootstrap=50, out=tmp / "cmp")
    return {"report": unimodal / "report.html", "cross-modal": cross / "report.html",
            "comparison": tmp / "cmp" / "comparison.html"}


@pytest.mark.parametrize("width", [1400, 500])
@pytest.mark.parametrize("name", ["report", "cross-modal", "comparison"])
def test_pages_show_all_their_text_readably_at_both_widths(three_pages, name, width, tmp_path):
    shot = os.environ.get("HASHDIST_SCREENSHOTS")  # a directory: keep a screenshot of each page to look at
    view = rendered(three_pages[name], tmp_path, width, LAYOUT_PROBE,
                    screenshot=Path(shot) / f"{name}-{width}.png" if shot else None)
    assert view["problems"] == [], "\n".join(view["problems"])
    assert view["width"] <= view["viewport"]  # nothing wider than the window: a wide table scrolls in its box
    if width == 1400:
        wide = [t for t in view["tables"] if t["width"] > t["column"] + 1]
        assert not wide, wide


def test_the_cross_modal_page_names_its_dataset_and_gives_intervals(three_pages, tmp_path):
    view = rendered(three_pages["cross-modal"], tmp_path, 500)
    assert view["title"] == "hashdist report: mirflickr.zarr (image\u2192text, text\u2192image)"
    assert re.search(r"image\u2192text \d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\]", view["headline"]), view["headline"]
    assert any(caption.startswith("Each headline measure under ties, per task") for caption in view["captions"])
    assert view["images"] == view["decoded"] == 4


def test_the_radius_headline_says_how_many_balls_are_empty(three_pages, tmp_path):
    view = rendered(three_pages["report"], tmp_path)
    assert re.search(r"micro@r=2 P \d\.\d{4}, R \d\.\d{4}; \d+% of queries \(\d+ of \d+\) retrieve nothing",
                     view["headline"]), view["headline"]
    assert len([t for t in view["tables"] if t["caption"].startswith("What made these numbers")]) == 1
