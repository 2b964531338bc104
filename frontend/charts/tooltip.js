// One tooltip element shared by every chart of the tab.
import { Tooltip } from "../dom.js";

let shared = null;

export function tooltip() {
  if (!shared || !shared.el.isConnected) shared = new Tooltip(document.body);
  return shared;
}
