// The settings sent with each request, kept in this browser. An empty field sends
// nothing, so the server's default holds; the form shows that default greyed, as
// /props reports it, or says "server default" (a server without /props).

const KEY = "edgespec-settings";
const NUMBERS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed"];
const FIELDS = ["system", ...NUMBERS, "drafter", "num_draft"];
// Without /props: what every edgespec server takes ("model" only with a draft model loaded).
const DRAFTERS = [["lookup", "copies from the conversation"],
                  ["suffix", "copies, counted over conversations"],
                  ["model", "the draft model, if one is loaded"], ["off", "plain decoding"]];

export function load() {
  try {
    return {...Object.fromEntries(FIELDS.map(f => [f, ""])), ...JSON.parse(localStorage.getItem(KEY))};
  } catch {
    return Object.fromEntries(FIELDS.map(f => [f, ""]));
  }
}

export function save(settings) { localStorage.setItem(KEY, JSON.stringify(settings)); }

// The server's defaults from /props (llama-server's params, and edgespec's
// speculative: {drafters: {name: description}, drafter, num_draft, draft_model}).
export function serverDefaults(props) {
  const params = props?.default_generation_settings?.params || {};
  const speculative = props?.speculative || {};
  const fields = {temperature: params.temperature, top_p: params.top_p, top_k: params.top_k,
                  min_p: params.min_p, seed: params.seed, max_tokens: params.n_predict,
                  num_draft: speculative.num_draft};
  if (!(fields.max_tokens > 0)) delete fields.max_tokens;  // -1: until the context is full
  if (!(fields.seed >= 0)) delete fields.seed;  // -1: none
  return {fields, drafter: speculative.drafter, drafters: speculative.drafters || null};
}

// Fill the form with the settings, and the server's defaults as placeholders.
export function fill(form, settings, defaults) {
  const select = form.elements.drafter;
  const choices = defaults.drafters ? Object.entries(defaults.drafters) : DRAFTERS;
  select.replaceChildren(new Option(
    `auto: the server's default${defaults.drafter ? ` (${defaults.drafter})` : ""}`, ""));
  for (const [value, label] of choices) select.append(new Option(`${value}: ${label}`, value));
  for (const name of FIELDS) {
    const input = form.elements[name];
    input.value = settings[name] ?? "";
    if (name !== "drafter" && name !== "system") {
      const value = defaults.fields[name];
      input.placeholder = value === undefined || value === null ? "server default" : String(value);
    }
  }
}

export function read(form) {
  return Object.fromEntries(FIELDS.map(name => [name, form.elements[name].value.trim()]));
}

// The request fields these settings add to a chat request (the system message apart).
export function requestFields(settings) {
  const body = {};
  for (const name of NUMBERS) {
    if (settings[name] !== "" && settings[name] !== undefined) body[name] = Number(settings[name]);
  }
  const speculative = {};
  if (settings.drafter) speculative.drafter = settings.drafter;
  if (settings.num_draft) {
    speculative.num_draft = settings.num_draft === "auto" ? "auto" : Number(settings.num_draft);
  }
  if (Object.keys(speculative).length) body.speculative = speculative;
  return body;
}
