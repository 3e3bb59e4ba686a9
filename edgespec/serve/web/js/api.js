// The server's HTTP API: the API key, requests, a streamed chat reply, and what the
// server says of itself (/v1/models, and /props where the server has it).

const KEY = "edgespec-key";
let askKey = async () => false;  // set by main.js: asks for the key, true once one is given

export function onKeyNeeded(ask) { askKey = ask; }
export function apiKey() { return localStorage.getItem(KEY) || ""; }
export function setApiKey(key) {
  if (key) localStorage.setItem(KEY, key); else localStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function withKey(headers = {}) {
  const key = apiKey();
  return key ? {...headers, Authorization: "Bearer " + key} : headers;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = body.error?.message || message;
  } catch { /* not JSON: the status says it */ }
  return new ApiError(response.status, message);
}

// fetch() with the key; a 401 asks for the key and tries once more.
export async function request(path, options = {}) {
  for (let asked = false; ; asked = true) {
    const response = await fetch(path, {...options, headers: withKey(options.headers)});
    if (response.status === 401 && !asked && await askKey()) continue;
    if (!response.ok) throw await errorOf(response);
    return response;
  }
}

function post(path, body, signal) {
  return request(path, {method: "POST", signal, body: JSON.stringify(body),
                        headers: {"Content-Type": "application/json"}});
}

// A chat reply, streamed: onToken(text, source) for each token as it comes, where
// source is "copy" or "model" for an accepted draft (the kind of drafter that made
// it) and "" for the target's own token; onProgress(progress) while the prompt is
// processed (llama-server's prompt_progress: total, cache, processed, time_ms).
// Resolves to {finish, timings}.
export async function streamChat(body, {signal, onToken, onProgress = () => {}}) {
  const response = await post("v1/chat/completions", {...body, stream: true, return_progress: true}, signal);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const result = {finish: null, timings: null};
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return result;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return result;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(500, chunk.error.message);
        if (chunk.prompt_progress) onProgress(chunk.prompt_progress);
        const choice = chunk.choices?.[0];
        const text = choice?.delta?.content;
        if (text) onToken(text, choice.from_draft ? (choice.draft_kind || "draft") : "");
        if (choice?.finish_reason) result.finish = choice.finish_reason;
        if (chunk.timings) result.timings = chunk.timings;
      }
    }
  }
}

// A whole (not streamed) chat reply: {content, timings}.
export async function chat(body, signal) {
  const reply = await (await post("v1/chat/completions", {...body, stream: false}, signal)).json();
  return {content: reply.choices[0].message.content, timings: reply.timings};
}

// The served model's name, and /props (llama-server's defaults) where the server has it.
export async function serverInfo() {
  const info = {model: "", props: null};
  const models = await (await request("v1/models")).json();
  info.model = models.data?.[0]?.id || "";
  try {
    const response = await fetch("props", {headers: withKey()});
    if (response.ok) info.props = await response.json();
  } catch { /* no /props: built-in defaults */ }
  return info;
}
