"""The node's web page in a real browser (issue 16): headless Chromium from Debian (``./dev``
installs it), driven by Playwright, against a live daemon fed signed statements about a run with
a tampered step, a disputed step and a lying auditor.

Screenshots go to ``$OPEN1B_ARTIFACTS`` (default: the test's temporary directory), with
``heatmap.json``: the time the page's heatmap takes to draw 80,957 steps of a synthetic run.
"""

import json
import os
import re
from pathlib import Path

import cbor2
import pytest

from open1b.devnet import Daemons
from open1b.node.client import call
from open1b.node.store import Store
from open1b.protocol import Attestation
from tests.runs import attestation, run_manifest

from .conftest import ident

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("OPEN1B_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
STEPS, TAMPERED, DISPUTED, LIED, UNAUDITED = 48, 17, 29, 5, range(40, 48)
NOW = 1_800_000_000
FORGED = b"\x66" * 32  # the state an honest replay of the tampered step computes instead
SYNTHETIC_STEPS = 80_957
RGB = {"verified": (46, 158, 68), "disputed": (240, 140, 0), "refuted": (214, 40, 40), "unaudited": (217, 217, 217)}


def _att(manifest, signer, step, post_state=None):
    verdict = "match" if post_state is None else "mismatch"
    return attestation(ident(signer), run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step],
                       post_state=post_state or manifest.state_hashes[step + 1], verdict=verdict, engine=manifest.engine,
                       engine_version=manifest.engine_version, hardware="t", device="cpu/x86_64-avx2", elapsed_ms=3,
                       issued_at=NOW + step)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """One daemon whose store holds the run and its attestations (two trusted auditors, and a third
    that lies about one step), as if it had heard them on gossip."""
    workdir = tmp_path_factory.mktemp("web")
    manifest = run_manifest(ident(0), engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0,
                            steps=STEPS, state_hashes=[bytes([k]) * 32 for k in range(STEPS + 1)], created_at=NOW)
    daemons = Daemons(workdir, workdir, redundancy=2)
    daemons.plan(1)
    store = Store(daemons.dirs[0] / "store.sqlite")
    store.add_manifest(manifest)
    for k in range(STEPS):
        if k in UNAUDITED:
            continue
        store.add_attestation(_att(manifest, 1, k, FORGED if k == TAMPERED else None))
        store.add_attestation(_att(manifest, 2, k, FORGED if k in (TAMPERED, DISPUTED) else None))
    store.add_attestation(_att(manifest, 3, LIED, b"\x77" * 32))  # contradicts the settled step: flagged
    store.close()
    trust = [arg for i in (1, 2, 3) for arg in ("--trust", ident(i).peer_id)]
    daemons.start(0, audit=False, bootstrap=[], extra_args=tuple(trust))
    try:
        yield daemons, manifest
    finally:
        daemons.stop()


def _pixel(page, step):
    return tuple(page.evaluate("""step => {
        const c = document.getElementById("heatmap"), cell = +c.dataset.cell, cols = +c.dataset.cols;
        const x = (step % cols) * cell + 1, y = Math.floor(step / cols) * cell;  // a pixel off the patterns
        return Array.from(c.getContext("2d").getImageData(x, y, 1, 1).data.slice(0, 3));
    }""", step))


def test_the_page_shows_the_tampered_step_its_evidence_and_refuses_other_origins(node, tmp_path):
    from playwright.sync_api import sync_playwright

    daemons, manifest = node
    api, run = daemons.api(0), manifest.run_id.hex()
    artifacts = Path(os.environ.get("OPEN1B_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: ./dev installs Debian's chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, accept_downloads=True)
        outside: list[str] = []  # every request the page makes that is not to the node
        page.on("request", lambda r: None if r.url.startswith(f"http://{api}/") else outside.append(r.url))

        # runs: one run, its bar and counts
        page.goto(f"http://{api}/#/")
        page.wait_for_selector(f"a[href='#/run/{run}']", timeout=20_000)
        assert "refuted 1" in page.inner_text("main") and "disputed 1" in page.inner_text("main")
        page.screenshot(path=str(artifacts / "runs.png"))

        # run: the heatmap's colours at the tampered, a disputed, a verified and an unaudited step
        page.click(f"a[href='#/run/{run}']")
        page.wait_for_selector(f"#twin li[data-step='{TAMPERED}'][data-status='refuted']", timeout=20_000)
        assert _pixel(page, TAMPERED) == RGB["refuted"]
        assert _pixel(page, DISPUTED) == RGB["disputed"]
        assert _pixel(page, 3) == RGB["verified"] and _pixel(page, LIED) == RGB["verified"]
        assert _pixel(page, UNAUDITED[0]) == RGB["unaudited"]
        # the text twin lists every step that is not verified, with its status in words
        twin = page.eval_on_selector_all("#twin li", "els => els.map(e => [+e.dataset.step, e.dataset.status])")
        assert twin == sorted([[TAMPERED, "refuted"], [DISPUTED, "disputed"]] + [[k, "unaudited"] for k in UNAUDITED])
        page.screenshot(path=str(artifacts / "run.png"), full_page=True)

        # keyboard: focus the heatmap, move one step right, open it
        page.focus("#heatmap")
        page.keyboard.press("ArrowRight")
        assert page.inner_text("#hover").startswith("step 1: verified; auditors 2")
        page.keyboard.press("Enter")
        page.wait_for_selector("h1:has-text('Step 1: verified')", timeout=10_000)
        page.go_back()
        page.wait_for_selector("#heatmap", timeout=10_000)

        # zoom out: smaller cells, the same colours where the steps now are
        page.wait_for_function("document.getElementById('heatmap').dataset.cols")
        before = page.evaluate("+heatmap.dataset.cell")
        page.click("button[aria-label='zoom out']")
        assert page.evaluate("+heatmap.dataset.cell") < before and _pixel(page, TAMPERED) == RGB["refuted"]

        # click the tampered step's cell: its attestations, the evidence, the command to re-check
        cell, cols = page.evaluate("[+heatmap.dataset.cell, +heatmap.dataset.cols]")
        at = {"x": (TAMPERED % cols) * cell + cell / 2, "y": (TAMPERED // cols) * cell + cell / 2}
        page.hover("#heatmap", position=at)
        assert page.inner_text("#hover").startswith(f"step {TAMPERED}: refuted; auditors 0; dissenters 2")
        page.click("#heatmap", position=at)
        page.wait_for_selector(f"h1:has-text('Step {TAMPERED}: refuted')", timeout=10_000)
        assert f"open1b-node replay {run} --step {TAMPERED}" in page.inner_text("pre")
        assert page.inner_text("main").count("mismatch") == 2
        page.screenshot(path=str(artifacts / "step.png"), full_page=True)
        with page.expect_download() as download:
            page.click("#evidence")
        raw = Path(download.value.path()).read_bytes()
        statements = [Attestation.decode(b) for b in cbor2.loads(raw)]
        assert {(a.step, a.verdict, a.post_state) for a in statements} == {(TAMPERED, "mismatch", FORGED)}
        assert {a.signer_peer_id for a in statements} == {ident(1).peer_id, ident(2).peer_id}

        # the lying auditor's contradiction is shown with both signed statements
        page.goto(f"http://{api}/#/run/{run}/step/{LIED}")
        page.wait_for_selector(f"h1:has-text('Step {LIED}: verified')", timeout=10_000)
        assert ident(3).peer_id in page.inner_text("main")
        page.goto(f"http://{api}/#/peers")
        page.wait_for_selector("h1:has-text('Peers')")
        # the node's reachability and its reason (it may change between two reads: checked by shape)
        assert re.fullmatch(r"Reachability: (public|private|unknown) \(.+\)", page.inner_text("#reachability"))
        page.goto(f"http://{api}/#/node")
        page.wait_for_selector(f"td:has-text('{daemons.peer_id(0)}')", timeout=10_000)
        assert outside == [], outside  # no CDN, font or third-party request

        # the heatmap of a synthetic 80,957-step run: drawn, and how long it takes
        timing = page.evaluate("""n => {
            const codes = new Uint8Array(n);
            for (let k = 0; k < n; k++) codes[k] = [2, 2, 2, 2, 2, 2, 0, 1, 3, 4][k % 10];
            const canvas = document.createElement("canvas");
            const times = [];
            let g;
            for (let i = 0; i < 5; i++) {
                const t = performance.now();
                g = Heatmap.draw(canvas, codes, 3, 1200);
                canvas.getContext("2d").getImageData(0, 0, 1, 1);  // wait for the pixels, not just the call
                times.push(performance.now() - t);
            }
            const at = k => Array.from(canvas.getContext("2d").getImageData(
                Heatmap.origin(g, k).x + 1, Heatmap.origin(g, k).y, 1, 1).data.slice(0, 3));
            return {times, cells: g.cols * g.rows, refuted: at(n - 8), verified: at(n - 5)};
        }""", SYNTHETIC_STEPS)
        assert timing["cells"] >= SYNTHETIC_STEPS
        assert tuple(timing["refuted"]) == RGB["refuted"] and tuple(timing["verified"]) == RGB["verified"]
        weight = sum(len(page.evaluate("u => fetch(u).then(r => r.text())", f"http://{api}{path}").encode())
                     for path in ("/", "/static/page.js", "/static/heatmap.js", "/static/page.css"))
        (artifacts / "heatmap.json").write_text(json.dumps({
            "steps": SYNTHETIC_STEPS, "draw_ms_first": round(timing["times"][0], 1),
            "draw_ms_median": round(sorted(timing["times"])[2], 1), "page_bytes": weight}, indent=1) + "\n")
        assert weight < 200_000

        # a page on another origin: its form POST and its fetches to the API are refused, and the daemon runs on
        seen: list[tuple[str, int]] = []
        page.on("response", lambda r: seen.append((r.url, r.status)) if "/v1/" in r.url else None)
        evil = "http://localhost:9/evil.html"
        page.route(evil, lambda route: route.fulfill(content_type="text/html", body=f"""
            <form id=f method=post action="http://{api}/v1/shutdown"><input name=x value=1></form>
            <script>
              fetch("http://{api}/v1/shutdown", {{method: "POST", mode: "no-cors", body: "x=1",
                    headers: {{"content-type": "application/x-www-form-urlencoded"}}}}).catch(() => 0);
              window.read = fetch("http://{api}/v1/status").then(r => "read " + r.status, e => "blocked");
            </script>"""))
        page.goto(evil)
        assert page.evaluate("window.read") == "blocked"
        with page.expect_navigation():
            page.evaluate("document.getElementById('f').submit()")
        assert (f"http://{api}/v1/shutdown", 403) in seen, seen
        assert daemons.procs[0].poll() is None and call(api, "/v1/status")["peer_id"] == daemons.peer_id(0)
        browser.close()
