"use strict";
// One cell per step on a canvas, written straight into an ImageData: 80,957 steps are 80,957
// cells of a few pixels, not 80,957 DOM nodes. Colour is never the only cue: at 4 px and more a
// cell also carries a pattern (stripes: disputed, cross: refuted, dot: claimed), and the page
// lists every step that is not verified as text.
window.Heatmap = (() => {
  const STATUSES = ["unaudited", "claimed", "verified", "disputed", "refuted"];
  const CODE = Object.fromEntries(STATUSES.map((s, i) => [s, i]));
  // RGB per status (matches page.css), and the darker ink of its pattern
  const RGB = [[217, 217, 217], [58, 120, 216], [46, 158, 68], [240, 140, 0], [214, 40, 40]];
  const INK = [[217, 217, 217], [16, 40, 90], [46, 158, 68], [90, 50, 0], [70, 0, 0]];
  const MAX_HEIGHT = 16384;  // browsers refuse larger canvases

  const pack = ([r, g, b]) => (255 << 24) | (b << 16) | (g << 8) | r;  // little-endian RGBA in a Uint32
  const FILL = RGB.map(pack), MARK = INK.map(pack);

  function inked(code, i, j, cell) {  // is pixel (i, j) of a cell part of its status's pattern?
    if (cell < 4) return false;
    if (code === 3) return (i + j) % 4 === 0;                   // disputed: diagonal stripes
    if (code === 4) return i === j || i + j === cell - 1;        // refuted: a cross
    if (code === 1) { const c = cell >> 1; return Math.abs(i - c) < 2 && Math.abs(j - c) < 2; }  // claimed: a dot
    return false;
  }

  // The geometry of a drawing: cells per row for the width, cell size clamped so it fits.
  function layout(count, cell, width) {
    let cols = Math.max(1, Math.floor(width / cell));
    while (cell > 1 && Math.ceil(count / cols) * cell > MAX_HEIGHT) { cell -= 1; cols = Math.max(1, Math.floor(width / cell)); }
    return { cell, cols, rows: Math.max(1, Math.ceil(count / cols)), count };
  }

  // Draw ``codes`` (a Uint8Array of status codes, one per step) on ``canvas``; returns the layout.
  function draw(canvas, codes, cell, width) {
    const g = layout(codes.length, cell, width);
    canvas.width = g.cols * g.cell;
    canvas.height = g.rows * g.cell;
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(canvas.width, canvas.height);
    const px = new Uint32Array(image.data.buffer);
    const W = canvas.width, c = g.cell;
    for (let k = 0; k < codes.length; k++) {
      const code = codes[k], x0 = (k % g.cols) * c, y0 = Math.floor(k / g.cols) * c;
      const fill = FILL[code], mark = MARK[code];
      for (let j = 0; j < c; j++) {
        const row = (y0 + j) * W + x0;
        for (let i = 0; i < c; i++) px[row + i] = inked(code, i, j, c) ? mark : fill;
      }
    }
    ctx.putImageData(image, 0, 0);
    return g;
  }

  // The step under canvas pixel (x, y), or -1.
  function stepAt(g, x, y) {
    const col = Math.floor(x / g.cell), row = Math.floor(y / g.cell);
    const k = row * g.cols + col;
    return col < g.cols && k >= 0 && k < g.count ? k : -1;
  }

  // The top-left pixel of step k's cell.
  function origin(g, k) { return { x: (k % g.cols) * g.cell, y: Math.floor(k / g.cols) * g.cell }; }

  return { STATUSES, CODE, RGB, draw, layout, stepAt, origin };
})();
