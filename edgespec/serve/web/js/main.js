// The chat page: conversations and replies, wired to the page's controls.
import * as api from "./api.js";
import {copyText} from "./markdown.js";
import * as settingsForm from "./settings.js";
import {focusSearch, onSearch, renderList} from "./sidebar.js";
import {recordPlain} from "./stats.js";
import * as store from "./store.js";
import * as tree from "./tree.js";
import {renderConversation, showProgress, updateStreaming} from "./view.js";
import {initTheme} from "./theme.js";

const $ = id => document.getElementById(id);
const state = {
  conversations: new Map(),
  currentId: null,
  streaming: null,  // {conversation, message, controller} while a reply comes
  model: "",
  settings: settingsForm.load(),
  defaults: settingsForm.serverDefaults(null),
};

const current = () => state.conversations.get(state.currentId) || null;
const newestFirst = () => [...state.conversations.values()].sort((a, b) => b.updated - a.updated);

function showError(text) {
  $("error").textContent = text || "";
  $("error").hidden = !text;
}

async function persist(conversation) {
  state.conversations.set(conversation.id, conversation);
  await store.save(conversation);
}

function renderAll() {
  const conversation = current();
  renderList(newestFirst(), state.currentId, listActions);
  renderConversation({conversation, model: state.model, actions: messageActions,
                      streamingId: state.streaming?.conversation === conversation ? state.streaming.message.id : null});
  $("title").textContent = conversation ? tree.title(conversation) : "edgespec";
  $("send").hidden = Boolean(state.streaming);
  $("stop").hidden = !state.streaming;
}

// -- replies ----------------------------------------------------------------------------

async function reply(conversation, parentId) {
  const settings = state.settings;
  const request = {system: settings.system, ...settingsForm.requestFields(settings)};
  const {system, ...fields} = request;
  const body = {messages: tree.history(conversation, parentId, system), ...fields};
  const message = tree.add(conversation, parentId, {role: "assistant", pieces: [], request});
  const controller = new AbortController();
  state.streaming = {conversation, message, controller};
  showError("");
  await persist(conversation);
  renderAll();
  let frame = 0;
  const onToken = (text, source) => {
    message.content += text;
    const last = message.pieces.at(-1);
    if (last && last[1] === source) {
      last[0] += text;
      last[2] += 1;
    } else {
      message.pieces.push([text, source, 1]);
    }
    frame ||= requestAnimationFrame(() => {
      frame = 0;
      if (current() === conversation) updateStreaming(message);
    });
  };
  const onProgress = progress => {
    showProgress(message, progress);
    if (current() === conversation) updateStreaming(message);
  };
  try {
    const result = await api.streamChat(body, {signal: controller.signal, onToken, onProgress});
    message.timings = result.timings;
    message.finish = result.finish;
    recordPlain(state.model, result.timings);
  } catch (error) {
    if (error.name === "AbortError") message.stopped = true;
    else message.error = error.message;
  } finally {
    cancelAnimationFrame(frame);
    showProgress(message, null);
    state.streaming = null;
    conversation.updated = Date.now();
    if (state.conversations.has(conversation.id)) await persist(conversation);  // (not if deleted meanwhile)
    renderAll();
  }
}

async function send(text) {
  if (state.streaming || !text.trim()) return;
  let conversation = current();
  if (!conversation) {
    conversation = tree.create();
    state.currentId = conversation.id;
  }
  const user = tree.add(conversation, conversation.leaf, {role: "user", content: text});
  await reply(conversation, user.id);
}

function stop() { state.streaming?.controller.abort(); }

const messageActions = {
  async edit(message, text) {
    if (state.streaming) return;
    const conversation = current();
    const user = tree.add(conversation, message.parent, {role: "user", content: text});
    await reply(conversation, user.id);
  },
  async regenerate(message) {
    if (!state.streaming) await reply(current(), message.parent);
  },
  async switchVersion(message, step) {
    const conversation = current();
    tree.switchVersion(conversation, message, step);
    await persist(conversation);
    renderAll();
  },
  async copy(text) { await copyText(text); },
  // × plain for this reply: its own request again, with the drafter off.
  async measurePlain(message) {
    if (state.streaming) return;
    const conversation = current();
    const {system, ...fields} = message.request || {};
    const body = {...fields, messages: tree.history(conversation, message.parent, system),
                  speculative: {drafter: "off"}};
    document.querySelectorAll(".measure-plain").forEach(b => { b.disabled = true; b.textContent = "measuring…"; });
    try {
      const {timings} = await api.chat(body);
      message.plain = {tps: timings.predicted_per_second, at: Date.now()};
      recordPlain(state.model, timings);
      await persist(conversation);
    } catch (error) {
      showError("measuring plain speed: " + error.message);
    }
    renderAll();
  },
};

// -- conversations ----------------------------------------------------------------------

const listActions = {
  open(id) {
    state.currentId = id;
    document.body.classList.remove("sidebar-open");
    renderAll();
    $("message").focus();
  },
  async rename(id, name) {
    const conversation = state.conversations.get(id);
    conversation.name = name;
    await persist(conversation);
    renderAll();
  },
  async remove(id) {
    if (state.streaming?.conversation.id === id) stop();
    state.conversations.delete(id);
    await store.remove(id);
    if (state.currentId === id) state.currentId = newestFirst()[0]?.id ?? null;
    renderAll();
  },
};

async function newChat() {
  const conversation = tree.create();
  state.currentId = conversation.id;
  await persist(conversation);
  document.body.classList.remove("sidebar-open");
  renderAll();
  $("message").focus();
}

function exportAll() {
  const conversations = [...state.conversations.values()].sort((a, b) => a.created - b.created);
  const blob = new Blob([store.toJson(conversations)], {type: "application/json"});
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `edgespec-chats-${new Date().toISOString().slice(0, 10)}.json`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

async function importFile(file) {
  try {
    const conversations = store.fromJson(await file.text());
    for (const conversation of conversations) await persist(conversation);
    state.currentId = conversations[0]?.id ?? state.currentId;
    showError("");
  } catch (error) {
    showError(`import of ${file.name}: ${error.message}`);
  }
  renderAll();
}

// -- the page's controls ----------------------------------------------------------------

function askKey() {
  const dialog = $("key-dialog");
  $("key").value = "";
  dialog.showModal();
  return new Promise(resolve => dialog.addEventListener("close", () => {
    const key = $("key").value.trim();
    if (key) api.setApiKey(key);
    resolve(Boolean(key));
  }, {once: true}));
}

function openSettings() {
  settingsForm.fill($("settings-form"), state.settings, state.defaults);
  $("settings").showModal();
}

function wire() {
  const input = $("message");
  $("composer").addEventListener("submit", event => {
    event.preventDefault();
    const text = input.value;
    if (state.streaming || !text.trim()) return;
    input.value = "";
    send(text);
  });
  input.addEventListener("keydown", event => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  document.addEventListener("keydown", event => {
    if (event.key === "Escape" && state.streaming && !document.querySelector("dialog[open]")) stop();
    if ((event.ctrlKey || event.metaKey) && event.shiftKey && event.key.toLowerCase() === "o") {
      event.preventDefault();
      newChat();
    }
    if ((event.ctrlKey || event.metaKey) && event.key.toLowerCase() === "k") {
      event.preventDefault();
      focusSearch();
    }
  });
  $("new-chat").addEventListener("click", newChat);
  $("export").addEventListener("click", exportAll);
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", event => {
    const [file] = event.target.files;
    if (file) importFile(file);
    event.target.value = "";
  });
  onSearch(() => renderList(newestFirst(), state.currentId, listActions));
  $("open-sidebar").addEventListener("click", () => document.body.classList.add("sidebar-open"));
  $("close-sidebar").addEventListener("click", () => document.body.classList.remove("sidebar-open"));
  $("messages").addEventListener("click", async event => {
    const button = event.target.closest(".copy-code");
    if (!button) return;
    await copyText(button.closest(".code").querySelector("code").textContent);
    button.textContent = "Copied";
  });
  const drafts = $("show-drafts");
  drafts.checked = localStorage.getItem("edgespec-show-drafts") !== "no";
  const showDrafts = () => document.body.classList.toggle("plain-view", !drafts.checked);
  drafts.addEventListener("change", () => {
    localStorage.setItem("edgespec-show-drafts", drafts.checked ? "yes" : "no");
    showDrafts();
  });
  showDrafts();
  $("open-settings").addEventListener("click", openSettings);
  $("settings-form").addEventListener("submit", () => {
    state.settings = settingsForm.read($("settings-form"));
    settingsForm.save(state.settings);
  });
  $("reset-settings").addEventListener("click", () => {
    settingsForm.fill($("settings-form"), {}, state.defaults);  // (kept once saved)
  });
  $("forget-key").addEventListener("click", () => api.setApiKey(""));
  initTheme($("theme"));
}

async function start() {
  wire();
  api.onKeyNeeded(askKey);
  for (const conversation of await store.all()) state.conversations.set(conversation.id, conversation);
  state.currentId = newestFirst()[0]?.id ?? null;
  renderAll();
  try {
    const info = await api.serverInfo();
    state.model = info.model;
    state.defaults = settingsForm.serverDefaults(info.props);
    $("model").textContent = info.model;
    renderAll();  // (× plain of the model's replies)
  } catch (error) {
    showError("the server: " + error.message);
  }
  document.body.dataset.ready = "true";  // (what the browser test waits for)
  $("message").focus();
}

start();
