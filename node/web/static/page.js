"use strict";
// The node's page: it reads the same /v1 routes as the CLI and renders with DOM calls only
// (textContent, never innerHTML): run ids, engines and peer ids come from other peers.
(() => {
  const view = document.getElementById("view");
  const live = document.getElementById("live");
  const TOKEN_KEY = "open1b-token";
  let state = { route: "", coverage: null, layout: null, cell: 0, focus: 0 };
  const TARGET_HEIGHT = 420;  // px: a run's first drawing picks the cell size that fills about this much

  // `open1b-node ui` may hand the token in the fragment (#token=…): kept for this tab only, and
  // taken out of the address bar so it is not bookmarked or shared.
  if (location.hash.startsWith("#token=")) {
    sessionStorage.setItem(TOKEN_KEY, location.hash.slice(7));
    history.replaceState(null, "", location.pathname + "#/");
  }

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") el.textContent = v; else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v);
    }
    for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return el;
  }

  async function get(path) {
    const r = await fetch(path, { headers: { accept: "application/json" } });
    const body = await r.json();
    if (!r.ok) throw new Error(`${path}: ${body.error || r.status}`);
    return body;
  }

  function table(headers, rows) {
    return h("table", {}, h("thead", {}, h("tr", {}, ...headers.map(t => h("th", { scope: "col", text: t })))),
      h("tbody", {}, ...rows.map(r => h("tr", {}, ...r.map(c => h("td", {}, c))))));
  }

  function countsOf(cov) {
    // disputed_steps lists every step with a counted mismatch, the refuted ones included
    const refuted = cov.refuted_steps.length, disputed = cov.disputed_steps.length - refuted;
    return { verified: cov.verified_steps, disputed, refuted, claimed: cov.claimed_steps, unaudited: cov.unaudited_steps };
  }

  function bar(counts, steps) {
    return h("div", { class: "bar", role: "img", "aria-label": Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ") },
      ...Object.entries(counts).filter(([, v]) => v).map(([k, v]) => {
        const part = h("span", { class: k });
        part.style.width = `${100 * v / steps}%`;  // through the CSSOM: the page's policy allows no inline style attribute
        return part;
      }));
  }

  async function runsView() {
    const runs = await get("/v1/runs");
    const rows = [];
    for (const r of runs) {
      let cov = null;
      try { cov = await get(`/v1/coverage/${r.run}`); } catch (e) { /* a run coverage cannot be computed for yet */ }
      const counts = cov ? countsOf(cov) : null;
      rows.push([h("a", { href: `#/run/${r.run}`, text: r.run.slice(0, 16) }), r.publisher || "", r.steps,
                 counts ? bar(counts, r.steps) : "", counts ? Object.entries(counts).map(([k, v]) => `${k} ${v}`).join(" · ") : ""]);
    }
    view.replaceChildren(h("h1", { text: "Runs" }),
      runs.length ? table(["run", "publisher", "steps", "coverage", "per status"], rows) : h("p", { text: "No runs known yet." }));
  }

  function codesOf(cov) {
    const codes = new Uint8Array(cov.steps);
    for (const s of cov.per_step) codes[s.step] = Heatmap.CODE[s.status] ?? 0;
    return codes;
  }

  function describe(k) {
    const s = state.coverage.per_step[k];
    return `step ${k}: ${s.status}; auditors ${s.auditors.length}${s.auditors.length ? " (" + s.auditors.map(a => a.slice(-8)).join(", ") + ")" : ""}` +
      (s.dissenters.length ? `; dissenters ${s.dissenters.length}` : "") + (s.claimants.length ? `; claimed by ${s.claimants.length}` : "");
  }

  function redraw() {
    const canvas = document.getElementById("heatmap");
    const width = Math.max(200, view.clientWidth - 40);
    if (!state.cell) state.cell = Math.min(24, Math.max(1, Math.floor(Math.sqrt(width * TARGET_HEIGHT / state.coverage.steps))));
    state.layout = Heatmap.draw(canvas, codesOf(state.coverage), state.cell, width);
    canvas.dataset.cell = state.layout.cell;  // the geometry, for anyone reading the pixels
    canvas.dataset.cols = state.layout.cols;
    view.querySelector("[data-field=cell]").textContent = `${state.layout.cell} px per step`;
  }

  async function runView(run) {
    const cov = await get(`/v1/coverage/${run}`);
    const fresh = state.route !== location.hash || !document.getElementById("heatmap");
    state.coverage = cov;
    if (fresh) {
      state.cell = 0;
      view.replaceChildren(document.getElementById("run-view").content.cloneNode(true));
      const canvas = document.getElementById("heatmap"), hover = document.getElementById("hover");
      const at = e => { const r = canvas.getBoundingClientRect(); return Heatmap.stepAt(state.layout, e.clientX - r.left, e.clientY - r.top); };
      canvas.addEventListener("mousemove", e => { const k = at(e); if (k >= 0) hover.textContent = describe(k); });
      canvas.addEventListener("click", e => { const k = at(e); if (k >= 0) location.hash = `#/run/${cov.run}/step/${k}`; });
      canvas.addEventListener("keydown", e => {
        const move = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: state.layout.cols, ArrowUp: -state.layout.cols }[e.key];
        if (move !== undefined) { state.focus = Math.min(cov.steps - 1, Math.max(0, state.focus + move)); hover.textContent = describe(state.focus); e.preventDefault(); }
        if (e.key === "Enter") location.hash = `#/run/${cov.run}/step/${state.focus}`;
        if (e.key === "+" || e.key === "-") zoom(e.key === "+" ? 1 : -1);
      });
      view.querySelectorAll("[data-zoom]").forEach(b => b.addEventListener("click", () => zoom(Number(b.dataset.zoom))));
    }
    view.querySelector("[data-field=run]").textContent = cov.run;
    const counts = countsOf(cov);
    view.querySelector("[data-field=summary]").textContent =
      `${cov.steps} steps, redundancy ${cov.redundancy}, policy ${cov.policy.name}: ` + Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ");
    redraw();
    const mark = { disputed: "!", refuted: "✗", claimed: "…", unaudited: "·" };
    document.getElementById("twin").replaceChildren(...cov.per_step.filter(s => s.status !== "verified").map(s =>
      h("li", { "data-step": s.step, "data-status": s.status },
        h("a", { href: `#/run/${cov.run}/step/${s.step}`, text: `step ${s.step}` }), ` ${mark[s.status] || ""} ${s.status}`)));
  }

  function zoom(dir) {
    state.cell = Math.min(24, Math.max(1, state.cell + dir * (state.cell >= 6 ? 2 : 1)));
    redraw();
  }

  async function stepView(run, k) {
    const [cov, atts, claims] = await Promise.all([get(`/v1/coverage/${run}`), get(`/v1/attestations/${run}?step=${k}`), get(`/v1/claims/${run}`)]);
    const s = cov.per_step[k], flagged = cov.flagged.filter(f => f.step === k);
    const evidence = `/v1/evidence/${cov.run}?step=${k}`;
    const time = t => new Date(t * 1000).toISOString().replace(".000", "");
    view.replaceChildren(
      h("p", {}, h("a", { href: `#/run/${cov.run}`, text: "← run " + cov.run.slice(0, 16) })),
      h("h1", { text: `Step ${k}: ${s.status}` }),
      h("h2", { text: "Attestations" }),
      table(["signer", "verdict", "device", "engine", "issued", "post state"],
        atts.map(a => [a.signer, a.verdict, a.device || a.hardware, a.engine, time(a.issued_at), h("code", { text: a.post_state.slice(0, 16) })])),
      h("h2", { text: "Claims" }),
      claims.filter(c => c.step === k).length ? table(["claimant", "slot", "expires in"],
        claims.filter(c => c.step === k).map(c => [c.claimant, c.slot, `${c.expires_in_s} s`])) : h("p", { text: "No live claims." }),
      h("h2", { text: "Disputes and evidence" }),
      flagged.length ? table(["signer", "kind", "its statement", "conflicting statement"],
        flagged.map(f => [f.signer, f.kind, h("code", { text: f.statement }), h("code", { text: f.conflicting })])) :
        h("p", { text: s.status === "verified" ? "No dispute: every counted replay agrees." : "No flagged statements." }),
      ...(s.fraud_proofs || []).map(d => h("p", { text: `Refuted by fraud proof ${d} (the publisher's trace has a false op: ` +
        "GET /v1/disputes/" + cov.run + ", and open1b-node dispute verify PROOF re-checks it offline)" })),
      h("p", {}, h("a", { id: "evidence", href: evidence, download: `open1b-evidence-${cov.run.slice(0, 16)}-step${k}.cbor`,
        text: "Download this step's signed statements (raw CBOR)" })),
      h("p", { text: "Re-check offline: the statements verify with their signers' keys; replaying the step decides who is right:" }),
      h("pre", { text: `open1b-node replay ${cov.run} --step ${k}` }));
  }

  async function peersView() {
    const [peers, status] = await Promise.all([get("/v1/peers"), get("/v1/status")]);
    const reach = status.reachability;
    view.replaceChildren(h("h1", { text: "Peers" }),
      h("p", { id: "reachability", text: `Reachability: ${reach.state} (${reach.reason})` }),
      h("h2", { text: `Connected (${peers.length})` }),
      table(["peer", "trusted", "rejected messages", "addresses"], peers.map(p => [p.peer_id, p.trusted ? "trusted" : "untrusted", p.rejected, p.addrs.join(" ")])),
      h("h2", { text: `Banned (${status.banned.length})` }),
      status.banned.length ? h("ul", {}, ...status.banned.map(b => h("li", { text: b }))) : h("p", { text: "None." }));
  }

  async function nodeView() {
    const status = await get("/v1/status");
    const token = sessionStorage.getItem(TOKEN_KEY);
    const out = h("div", { id: "doctor" });
    const run = async () => {
      out.replaceChildren(h("p", { text: "Running the doctor's checks…" }));
      const r = await fetch("/v1/doctor", { method: "POST", headers: { authorization: `Bearer ${token}` } });
      const body = await r.json();
      out.replaceChildren(r.ok ? table(["check", "result", "detail"], body.map(c => [c.check, c.level, c.detail])) : h("p", { class: "error", text: body.error }));
    };
    view.replaceChildren(h("h1", { text: "Node" }),
      table(["", ""], Object.entries(status).map(([k, v]) => [k, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)])),
      h("h2", { text: "Doctor" }),
      token ? h("button", { type: "button", onclick: run, text: "Run the doctor's checks" }) :
        h("p", { text: "Open this page with `open1b-node ui` to run the doctor's checks (they need the node's token)." }), out);
  }

  async function render() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
    try {
      if (parts[0] === "run" && parts[2] === "step") await stepView(parts[1], Number(parts[3]));
      else if (parts[0] === "run") await runView(parts[1]);
      else if (parts[0] === "peers") await peersView();
      else if (parts[0] === "node") await nodeView();
      else await runsView();
    } catch (e) {
      view.replaceChildren(h("p", { class: "error", text: String(e.message || e) }));
    }
    state.route = location.hash;
  }

  window.addEventListener("hashchange", () => { render(); view.focus(); });
  window.addEventListener("resize", () => { if (state.layout && document.getElementById("heatmap")) redraw(); });
  // Live updates: the node says when what it holds changed; the open view is drawn again.
  const events = new EventSource("/v1/events");
  // Changes come in bursts (a sync round brings many statements) and a large run's coverage is
  // megabytes: one redraw per REFRESH_MS at most. Step and node views stay as they are while read.
  const REFRESH_MS = 2000;
  let refresh = null;
  events.addEventListener("change", e => {
    live.textContent = "live · " + e.data;
    if (refresh === null && !location.hash.includes("/step/") && !location.hash.includes("node"))
      refresh = setTimeout(() => { refresh = null; render(); }, REFRESH_MS);
  });
  events.onerror = () => { live.textContent = "disconnected; retrying"; };
  render();
})();
