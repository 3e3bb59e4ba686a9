// What speculation did in one reply: the server's timings (llama-server's fields plus
// edgespec's draft_rounds and draft_rounds_per_drafter) and the tokens as they came.
//
// "× plain" needs a plain speed measured on this server: the reply's own request run
// again with the drafter off ("measure plain"), or else the latest reply this browser
// got with the drafter off from the same model. Without either it stays blank.

const PLAIN = "edgespec-plain";

function plainSpeeds() {
  try {
    return JSON.parse(localStorage.getItem(PLAIN)) || {};
  } catch {
    return {};
  }
}

// Keep a reply's speed as this model's plain speed, if it was generated plainly.
export function recordPlain(model, timings) {
  if (!timings || timings.drafter !== "none" || timings.predicted_n < 8) return;
  const speeds = plainSpeeds();
  speeds[model] = {tps: timings.predicted_per_second, at: Date.now()};
  localStorage.setItem(PLAIN, JSON.stringify(speeds));
}

export function plainSpeed(model) { return plainSpeeds()[model] || null; }

// Each accepted draft run as [token index in the reply, its length]: one round's accepted tokens.
export function acceptedRuns(pieces) {
  const runs = [];
  let at = 0;
  for (const [, source, tokens] of pieces) {
    if (source) runs.push([at, tokens]);
    at += tokens;
  }
  return {runs, tokens: at};
}

// The figures shown under a reply, by name (the browser test reads them by these names).
export function figures(message, model) {
  const t = message.timings;
  const {runs, tokens} = acceptedRuns(message.pieces || []);
  if (!t) {  // stopped before the end: only what the stream said
    return {tokens, accepted: runs.reduce((sum, [, n]) => sum + n, 0)};
  }
  const out = {tokens: t.predicted_n, tps: t.predicted_per_second, drafter: t.drafter};
  if (t.drafter === "none") return out;
  out.drafted = t.draft_n;
  out.accepted = t.draft_n_accepted;
  out.acceptance = t.draft_n ? t.draft_n_accepted / t.draft_n : null;
  if (t.draft_rounds !== undefined) {
    out.rounds = t.draft_rounds;
    out.mean_length = t.draft_rounds ? 1 + t.draft_n_accepted / t.draft_rounds : null;
  }
  out.chosen = t.draft_rounds_per_drafter || null;
  const plain = message.plain || plainSpeed(model);
  if (plain) {
    out.plain_tps = plain.tps;
    out.plain_source = message.plain ? "this request, drafter off" : "a reply with drafter off, in this browser";
    out.x_plain = t.predicted_per_second / plain.tps;
  }
  return out;
}

function item(name, html, title) {
  const span = document.createElement("span");
  span.dataset.stat = name;
  span.innerHTML = html;  // (numbers and fixed words only: nothing from the model)
  if (title) span.title = title;
  return span;
}

const num = (x, digits = 1) => Number(x).toFixed(digits);
const esc = text => String(text).replace(/[&<>"]/g, c => `&#${c.charCodeAt(0)};`);

// The stats line of a reply, with a "measure plain" button when × plain is unknown.
export function statsLine(message, model, measurePlain) {
  const f = figures(message, model);
  const line = document.createElement("div");
  line.className = "stats";
  if (!message.timings) {
    line.append(item("tokens", `stopped after <b>${f.tokens}</b> tokens`),
                item("accepted", `<b>${f.accepted}</b> from drafts`));
    return line;
  }
  line.append(item("tps", `<b>${num(f.tps)}</b> tok/s`, `${f.tokens} tokens`));
  if (f.drafter === "none") {
    line.append(item("drafter", "plain (drafter off)"));
    return line;
  }
  if (f.x_plain) {
    const near = message.plain ? "" : "≈";  // (another request's plain speed)
    line.append(item("x_plain", `<b>${near}${num(f.x_plain, 2)}×</b> plain`,
                     `plain: ${num(f.plain_tps)} tok/s, measured on this server (${f.plain_source})`));
  } else {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "measure-plain";
    button.textContent = "× plain?";
    button.title = "Run this request again with the drafter off, to measure plain speed";
    button.addEventListener("click", () => measurePlain(message));
    line.append(button);
  }
  line.append(item("drafted", `drafted <b>${f.drafted}</b>`),
              item("accepted", `accepted <b>${f.accepted}</b>`),
              item("acceptance", `acceptance <b>${f.acceptance === null ? "–" : Math.round(100 * f.acceptance) + "%"}</b>`));
  if (f.mean_length !== undefined) {
    line.append(item("mean_length", `mean accepted length <b>${f.mean_length === null ? "–" : num(f.mean_length, 2)}</b>`,
                     "tokens committed per verifying pass: 1 + accepted / rounds"));
  }
  // Auto mode's choices: the rounds each of its drafters drafted.
  const chosen = f.drafter.startsWith("auto") && f.chosen
    && Object.entries(f.chosen).map(([name, n]) => `${esc(name)} ×${n}`).join(", ");
  line.append(item("drafter", `drafter <b>${esc(f.drafter)}</b>${chosen ? " → " + chosen : ""}`,
                   chosen ? "auto mode's drafters; after the arrow, the rounds each drafted" : ""));
  line.append(sparkline(message.pieces || []));
  return line;
}

// A small chart of accepted draft lengths along the reply: a bar per round that had
// drafts accepted, at its place in the reply, as tall as the tokens it accepted.
function sparkline(pieces) {
  const {runs, tokens} = acceptedRuns(pieces);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  const width = 120, height = 18;
  const tallest = Math.max(1, ...runs.map(([, n]) => n));
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("role", "img");
  const title = document.createElementNS(ns, "title");
  title.textContent = `accepted draft lengths along the reply (longest ${tallest === 1 && !runs.length ? 0 : tallest})`;
  svg.append(title);
  for (const [at, n] of runs) {
    const bar = document.createElementNS(ns, "rect");
    const h = Math.max(1, (height * n) / tallest);
    bar.setAttribute("x", (width * at) / Math.max(1, tokens));
    bar.setAttribute("y", height - h);
    bar.setAttribute("width", Math.max(1.5, (width * n) / Math.max(1, tokens)));
    bar.setAttribute("height", h);
    svg.append(bar);
  }
  return svg;
}
