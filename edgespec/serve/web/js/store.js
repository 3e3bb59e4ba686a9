// Conversations kept in the browser (IndexedDB), one record each, and as JSON files.

const DB = "edgespec-chat";
const STORE = "conversations";
const FORMAT = "edgespec-chat";
let opened = null;

function database() {
  opened ??= new Promise((resolve, reject) => {
    const open = indexedDB.open(DB, 1);
    open.onupgradeneeded = () => open.result.createObjectStore(STORE, {keyPath: "id"});
    open.onsuccess = () => resolve(open.result);
    open.onerror = () => reject(open.error);
  });
  return opened;
}

async function transaction(mode, work) {
  const db = await database();
  return new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, mode);
    const request = work(tx.objectStore(STORE));
    tx.oncomplete = () => resolve(request.result);
    tx.onerror = tx.onabort = () => reject(tx.error);
  });
}

export const all = () => transaction("readonly", store => store.getAll());
export const save = conversation => transaction("readwrite", store => store.put(conversation));
export const remove = id => transaction("readwrite", store => store.delete(id));

// The file Export writes: every conversation, as kept.
export function toJson(conversations) {
  return JSON.stringify({format: FORMAT, version: 1, conversations}, null, 1);
}

// The conversations of an exported file, checked enough to be shown; an error says why not.
export function fromJson(text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch {
    throw new Error("not a JSON file");
  }
  if (data?.format !== FORMAT || !Array.isArray(data.conversations)) {
    throw new Error("not an edgespec chat export (format \"edgespec-chat\")");
  }
  for (const c of data.conversations) {
    const ok = typeof c?.id === "string" && c.messages?.root && c.messages[c.leaf]
      && Object.values(c.messages).every(m => Array.isArray(m.children)
        && (m.id === "root" || (c.messages[m.parent] && typeof m.content === "string")));
    if (!ok) throw new Error(`conversation ${JSON.stringify(c?.name ?? c?.id)} is malformed`);
  }
  return data.conversations;
}
