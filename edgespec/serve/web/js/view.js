// The shown branch of a conversation: messages, their versions, and their actions.
import {render} from "./markdown.js";
import {statsLine} from "./stats.js";
import {button} from "./dom.js";
import {branch, version} from "./tree.js";

const container = document.getElementById("messages");
// Prompts with fewer tokens than this left to process show no progress bar.
const PROGRESS_MIN_TOKENS = 256;
let progress = null;  // {id, prompt_progress} of the reply whose prompt is being processed

// How far the prompt of the reply being streamed has come (null: done or none).
export function showProgress(message, prompt) {
  progress = prompt && message ? {id: message.id, prompt} : null;
}

// context: {conversation, streamingId, model, actions: {edit, regenerate, switchVersion,
// measurePlain, copy}}
export function renderConversation(context) {
  const {conversation} = context;
  container.replaceChildren();
  const messages = conversation ? branch(conversation) : [];
  if (!messages.length) {
    const empty = document.createElement("p");
    empty.className = "empty muted";
    empty.textContent = "Ask something. Replies show what speculation did: tokens/s, drafts accepted, and the drafted tokens tinted.";
    container.append(empty);
    return;
  }
  for (const message of messages) container.append(messageElement(message, context));
  container.scrollTop = container.scrollHeight;
}

function messageElement(message, context) {
  const {conversation, actions} = context;
  const article = document.createElement("article");
  article.className = `msg ${message.role}`;
  article.dataset.id = message.id;
  const body = document.createElement("div");
  body.className = "body";
  article.append(body);
  fillBody(body, message);

  const meta = document.createElement("div");
  meta.className = "meta";
  const [n, of] = version(conversation, message);
  if (of > 1) {
    const versions = document.createElement("span");
    versions.className = "versions";
    const label = document.createElement("span");
    label.className = "version";
    label.textContent = `${n}/${of}`;
    versions.append(button("prev-version", "‹", () => actions.switchVersion(message, -1), "Previous version"),
                    label,
                    button("next-version", "›", () => actions.switchVersion(message, 1), "Next version"));
    meta.append(versions);
  }
  const streaming = message.id === context.streamingId;
  article.classList.toggle("streaming", streaming);
  if (!streaming) {
    meta.append(button("copy-message", "Copy", () => actions.copy(message.content)));
    if (message.role === "user") {
      meta.append(button("edit", "Edit", () => editor(article, body, message, actions)));
    } else {
      meta.append(button("regenerate", "Regenerate", () => actions.regenerate(message)));
      if (message.timings || message.stopped) meta.append(statsLine(message, context.model, actions.measurePlain));
    }
  }
  article.append(meta);
  return article;
}

function fillBody(body, message) {
  if (message.role === "user") {
    body.textContent = message.content;
  } else {
    render(body, message.content, message.pieces);
    const p = progress?.id === message.id ? progress.prompt : null;
    if (p && !message.content && p.processed < p.total && p.total - p.cache >= PROGRESS_MIN_TOKENS) {
      body.append(progressBar(p));
    }
    if (message.error) {
      const error = document.createElement("p");
      error.className = "error";
      error.textContent = "error: " + message.error;
      body.append(error);
    }
  }
}

// Edit a user message in place: Enter (or Send) asks again as a new version.
function editor(article, body, message, actions) {
  const box = document.createElement("div");
  box.className = "edit";
  const area = document.createElement("textarea");
  area.value = message.content;
  area.setAttribute("aria-label", "Edit the message");
  const cancel = () => box.replaceWith(body);
  const send = () => area.value.trim() && actions.edit(message, area.value);
  area.addEventListener("keydown", event => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); send(); }
    if (event.key === "Escape") { event.stopPropagation(); cancel(); }
  });
  const buttons = document.createElement("div");
  buttons.className = "buttons";
  buttons.append(button("cancel-edit", "Cancel", cancel), button("send-edit primary", "Send", send));
  box.append(area, buttons);
  body.replaceWith(box);
  area.focus();
}

// The prompt's processing: a bar, tokens done of the total, and the time left at the rate so far.
function progressBar(p) {
  const box = document.createElement("div");
  box.className = "prompt-progress";
  const bar = document.createElement("progress");
  bar.max = p.total;
  bar.value = p.processed;
  const label = document.createElement("span");
  const done = p.processed - p.cache;
  const left = done > 0 && p.time_ms > 0 ? Math.round((p.total - p.processed) * p.time_ms / done / 1000) : null;
  label.textContent = `Reading the prompt: ${p.processed.toLocaleString()} of ${p.total.toLocaleString()} tokens` +
    (p.cache ? ` (${p.cache.toLocaleString()} cached)` : "") + (left !== null ? `, about ${left} s left` : "");
  box.append(bar, label);
  return box;
}

// Redraw a reply being streamed (its text and tints so far).
export function updateStreaming(message) {
  const article = container.querySelector(`article[data-id="${message.id}"]`);
  if (!article) return;
  const nearBottom = container.scrollHeight - container.scrollTop - container.clientHeight < 80;
  fillBody(article.querySelector(".body"), message);
  if (nearBottom) container.scrollTop = container.scrollHeight;
}
