// The list of conversations: open, rename, delete, search.
import {button} from "./dom.js";
import {matches, title} from "./tree.js";

const list = document.getElementById("conversations");
const search = document.getElementById("search");

// conversations: newest first; actions: {open(id), rename(id, name), remove(id)}.
export function renderList(conversations, currentId, actions) {
  const query = search.value;
  list.replaceChildren();
  for (const conversation of conversations) {
    if (!matches(conversation, query)) continue;
    const li = document.createElement("li");
    li.dataset.id = conversation.id;
    li.classList.toggle("current", conversation.id === currentId);
    const name = title(conversation);
    const open = button("open", name, () => actions.open(conversation.id));
    open.title = name;
    if (conversation.id === currentId) open.setAttribute("aria-current", "true");
    const rename = button("act rename", "✎", () => {
      const input = document.createElement("input");
      input.value = name;
      input.setAttribute("aria-label", "New name");
      const done = keep => {
        if (!input.isConnected) return;
        if (keep && input.value.trim()) actions.rename(conversation.id, input.value.trim());
        else renderList(conversations, currentId, actions);
      };
      input.addEventListener("keydown", event => {
        if (event.key === "Enter") done(true);
        if (event.key === "Escape") { event.stopPropagation(); done(false); }
      });
      input.addEventListener("blur", () => done(true));
      li.replaceChildren(input);
      input.focus();
      input.select();
    }, "Rename");
    const remove = button("act delete", "✕", () => {
      if (confirm(`Delete "${name}"?`)) actions.remove(conversation.id);
    }, "Delete");
    li.append(open, rename, remove);
    list.append(li);
  }
}

export function onSearch(callback) { search.addEventListener("input", callback); }
export function focusSearch() { search.focus(); search.select(); }
