// Upstream requests per second over time, one line per run, as hand-written SVG text: axes with ticks, one polyline
// per run, a legend, and the brownout shaded. No dependency, and the file diffs as text.

interface Series {
  label: string;
  color: string;
  /** [seconds since the run's start, upstream requests in that second] */
  points: Array<[number, number]>;
}

const W = 860;
const H = 420;
const M = { left: 64, right: 20, top: 40, bottom: 92 };

/** A round step for about `count` ticks over 0..max: 1, 2 or 5 times a power of ten. */
function niceStep(max: number, count: number): number {
  const raw = max / count;
  const p = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw)!;
}

const esc = (t: string) => t.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

export function upstreamChart(title: string, series: Series[], brownout: [number, number], xMax: number): string {
  const yTop = Math.max(1, ...series.flatMap((s) => s.points.map(([, v]) => v)));
  const yStep = niceStep(yTop, 6);
  const yMax = Math.ceil(yTop / yStep) * yStep;
  const xStep = niceStep(xMax, 10);
  const pw = W - M.left - M.right;
  const ph = H - M.top - M.bottom;
  const x = (t: number) => M.left + (pw * t) / xMax;
  const y = (v: number) => M.top + ph - (ph * v) / yMax;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${W / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">${esc(title)}</text>`,
    // The brownout, behind everything else.
    `<rect x="${x(brownout[0]).toFixed(1)}" y="${M.top}" width="${(x(brownout[1]) - x(brownout[0])).toFixed(1)}" height="${ph}" fill="#f4c7c3" fill-opacity="0.5"/>`,
    `<text x="${((x(brownout[0]) + x(brownout[1])) / 2).toFixed(1)}" y="${M.top + 14}" text-anchor="middle" fill="#a33">brownout</text>`,
  ];
  for (let v = 0; v <= yMax; v += yStep) {
    out.push(`<line x1="${M.left}" x2="${W - M.right}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="#e4e4e4"/>`);
    out.push(`<text x="${M.left - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end">${v}</text>`);
  }
  for (let t = 0; t <= xMax; t += xStep) {
    out.push(`<line x1="${x(t).toFixed(1)}" x2="${x(t).toFixed(1)}" y1="${M.top + ph}" y2="${M.top + ph + 5}" stroke="#333"/>`);
    out.push(`<text x="${x(t).toFixed(1)}" y="${M.top + ph + 18}" text-anchor="middle">${t}</text>`);
  }
  out.push(`<line x1="${M.left}" x2="${M.left}" y1="${M.top}" y2="${M.top + ph}" stroke="#333"/>`);
  out.push(`<line x1="${M.left}" x2="${W - M.right}" y1="${M.top + ph}" y2="${M.top + ph}" stroke="#333"/>`);
  out.push(`<text x="${M.left + pw / 2}" y="${M.top + ph + 36}" text-anchor="middle">seconds since the start of traffic</text>`);
  out.push(`<text transform="translate(16 ${M.top + ph / 2}) rotate(-90)" text-anchor="middle">upstream requests per second</text>`);
  for (const s of series) {
    // A point per second, drawn at the middle of its second.
    const pts = s.points.filter(([t]) => t >= 0 && t < xMax).map(([t, v]) => `${x(t + 0.5).toFixed(1)},${y(v).toFixed(1)}`);
    out.push(`<polyline fill="none" stroke="${s.color}" stroke-width="2" points="${pts.join(' ')}"/>`);
  }
  series.forEach((s, i) => {
    const lx = M.left + i * (pw / series.length);
    const ly = H - 22;
    out.push(`<line x1="${lx}" x2="${lx + 24}" y1="${ly - 4}" y2="${ly - 4}" stroke="${s.color}" stroke-width="3"/>`);
    out.push(`<text x="${lx + 30}" y="${ly}">${esc(s.label)}</text>`);
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}
