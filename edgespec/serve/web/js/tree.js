// A conversation as a tree of messages: an edit or a regenerate adds a sibling, so
// every version stays; `leaf` is the message the shown branch ends at.
//
// {id, name, created, updated, leaf, messages: {root: {id: "root", children: [...]},
//  id: {id, parent, role, content, children, created, ...the reply's stats}}}

export function uid() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
}

export function create() {
  const now = Date.now();
  return {id: uid(), name: "", created: now, updated: now, leaf: "root",
          messages: {root: {id: "root", parent: null, role: "root", children: []}}};
}

// A new message under `parent`, shown from now on.
export function add(conversation, parent, fields) {
  const message = {id: uid(), parent, children: [], created: Date.now(), content: "", ...fields};
  conversation.messages[message.id] = message;
  conversation.messages[parent].children.push(message.id);
  conversation.leaf = message.id;
  conversation.updated = message.created;
  return message;
}

// The shown branch, from the first message to the leaf.
export function branch(conversation) {
  const out = [];
  for (let id = conversation.leaf; id !== "root"; id = conversation.messages[id].parent) {
    out.unshift(conversation.messages[id]);
  }
  return out;
}

// [this version's number (from 1), how many versions] of a message.
export function version(conversation, message) {
  const siblings = conversation.messages[message.parent].children;
  return [siblings.indexOf(message.id) + 1, siblings.length];
}

// Show another version of a message (step -1 or +1), and below it its latest replies.
export function switchVersion(conversation, message, step) {
  const siblings = conversation.messages[message.parent].children;
  const index = siblings.indexOf(message.id) + step;
  if (index < 0 || index >= siblings.length) return;
  let shown = conversation.messages[siblings[index]];
  while (shown.children.length) shown = conversation.messages[shown.children.at(-1)];
  conversation.leaf = shown.id;
}

// The messages a reply to `parent` is asked for (the system message first, if any).
export function history(conversation, parent, system) {
  conversation = {...conversation, leaf: parent};
  const messages = branch(conversation).map(m => ({role: m.role, content: m.content}));
  return system ? [{role: "system", content: system}, ...messages] : messages;
}

export function title(conversation) {
  if (conversation.name) return conversation.name;
  const first = conversation.messages[conversation.messages.root.children[0]];
  const text = first ? first.content.trim().replace(/\s+/g, " ") : "";
  return text.length > 48 ? text.slice(0, 47) + "…" : text || "New chat";
}

// Whether a conversation's name or any of its messages contain the words searched for.
export function matches(conversation, query) {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return true;
  const text = [title(conversation), ...Object.values(conversation.messages).map(m => m.content || "")]
    .join("\n").toLowerCase();
  return words.every(word => text.includes(word));
}
