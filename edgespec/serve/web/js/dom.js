// Small DOM helpers shared by the page's modules.

// A button with a class, its text, a click handler and (optional) an accessible name,
// also shown as its tooltip.
export function button(className, text, onClick, label) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.textContent = text;
  if (label) b.setAttribute("aria-label", label), b.title = label;
  b.addEventListener("click", onClick);
  return b;
}
