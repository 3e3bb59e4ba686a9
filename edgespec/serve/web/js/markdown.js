// A reply's markdown as safe HTML: marked parses it, HTML the model writes is shown as
// text (never parsed), images become links (nothing loads from a model's URL), code is
// highlighted with a copy button, and DOMPurify cleans the result all the same.
import {Marked} from "../vendor/marked-18.3.0.esm.js";
import DOMPurify from "../vendor/purify-3.5.0.es.mjs";
import hljs from "../vendor/highlight-11.12.0.min.js";

const ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"};
const escape = text => text.replace(/[&<>"']/g, c => ESCAPES[c]);

const marked = new Marked({
  gfm: true,
  renderer: {
    html({text}) { return escape(text); },
    image({href, text}) {
      return `<a href="${escape(href)}">${escape(text || href)}</a>`;
    },
    code({text, lang}) {
      const language = (lang || "").match(/^\S*/)[0].toLowerCase();
      // No guessing of the language: a fence that names none stays plain.
      const html = language && hljs.getLanguage(language)
        ? hljs.highlight(text, {language, ignoreIllegals: true}).value : escape(text);
      return `<div class="code"><div class="code-head"><span>${escape(language || "text")}</span>` +
        `<button type="button" class="copy-code">Copy</button></div>` +
        `<pre><code class="hljs">${html}</code></pre></div>`;
    },
  },
});

DOMPurify.addHook("afterSanitizeAttributes", node => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});
const PURIFY = {FORBID_TAGS: ["img", "style", "form", "input", "textarea", "select", "svg", "math"],
                FORBID_ATTR: ["style"]};

// Render `text` into `element`, tinting what came from drafts when `pieces` are given.
export function render(element, text, pieces) {
  element.innerHTML = DOMPurify.sanitize(marked.parse(text), PURIFY);
  if (pieces) tint(element, pieces);
}

// Tint the drafted characters of a reply where they show. `pieces` are [text, source]
// as the tokens came (source "copy", "model", or "" for the target's own). The shown
// text is the reply less markdown's syntax, so each shown character is matched to the
// next equal character of the reply.
function tint(root, pieces) {
  let reply = "";
  const sources = [];
  for (const [text, source] of pieces) {
    reply += text;
    for (let i = 0; i < text.length; i++) sources.push(source);
  }
  if (!sources.some(Boolean)) return;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const nodes = [];
  while (walker.nextNode()) {
    if (!walker.currentNode.parentElement.closest(".code-head")) nodes.push(walker.currentNode);
  }
  let at = 0;
  for (const node of nodes) {
    const text = node.data;
    const marks = [];
    for (const char of text) {
      const found = reply.indexOf(char, at);
      if (found < 0) {
        marks.push("");
      } else {
        marks.push(sources[found]);
        at = found + char.length;
      }
    }
    if (marks.some(Boolean)) node.replaceWith(spans(text, marks));
  }
}

function spans(text, marks) {
  const fragment = document.createDocumentFragment();
  const chars = [...text];
  let start = 0;
  for (let i = 1; i <= chars.length; i++) {
    if (i < chars.length && marks[i] === marks[start]) continue;
    const part = chars.slice(start, i).join("");
    if (marks[start]) {
      const span = document.createElement("span");
      span.className = "d-" + marks[start];
      span.textContent = part;
      fragment.append(span);
    } else {
      fragment.append(part);
    }
    start = i;
  }
  return fragment;
}

// Copy text to the clipboard, also where the page is not a secure context (a LAN address).
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = document.createElement("textarea");
  area.value = text;
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}
