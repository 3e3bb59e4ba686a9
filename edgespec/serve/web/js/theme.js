// Light and dark themes: the system's by default; the button cycles auto, light, dark.
const KEY = "edgespec-theme";
const ICONS = {auto: "◐", light: "☀", dark: "☾"};
const system = matchMedia("(prefers-color-scheme: dark)");

function apply(choice) {
  const theme = choice === "auto" ? (system.matches ? "dark" : "light") : choice;
  document.documentElement.dataset.theme = theme;
  return theme;
}

export function initTheme(button) {
  let choice = localStorage.getItem(KEY) || "auto";
  const show = () => {
    const theme = apply(choice);
    button.textContent = ICONS[choice];
    button.title = `Theme: ${choice}${choice === "auto" ? ` (${theme})` : ""}`;
  };
  button.addEventListener("click", () => {
    choice = {auto: "light", light: "dark", dark: "auto"}[choice];
    localStorage.setItem(KEY, choice);
    show();
  });
  system.addEventListener("change", show);
  show();
}
