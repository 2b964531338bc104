// Entry point of the layergrad tab. TensorBoard loads this module in an iframe whose
// page is <base href="plugin/layergrad/"> + import("./index.js").then(m => m.render()).
// Everything else is imported here, inside a try, so that a file that fails to load
// leaves a message in the tab rather than a blank page.

function message(text) {
  const p = document.createElement("p");
  p.className = "lg-error";
  p.textContent = text;
  document.body.appendChild(p);
}

function loadStyle(href) {
  return new Promise((resolve) => {
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = href;
    link.onload = resolve;
    link.onerror = resolve;
    setTimeout(resolve, 3000);
    document.head.appendChild(link);
  });
}

export async function render() {
  await loadStyle("./style.css");
  let App;
  try {
    ({ App } = await import("./app.js"));
  } catch (e) {
    message(`The layer-gradients tab failed to load (${e && e.message}). Reinstalling tb_layergrad may help.`);
    throw e;
  }
  const root = document.createElement("div");
  root.className = "lg-root";
  document.body.appendChild(root);
  const app = new App(root);
  window.layergradApp = app; // for debugging from the console
  await app.start();
}
