// The pack's warnings and status lines on the node that logged them, kept after the job ends.
//
// The server sends them as the event below (nodes/services.py, messages_on_node): every line so far while the
// node runs, and when it ends, "No warnings in this run." after a clean run of a node that showed some.
// Progress text would not do: newer frontends clear it when the job ends, and show only its first lines.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const EVENT = "qwen3tts-morph.messages"; // nodes/services.py MESSAGES_EVENT
const WIDGET = "morph_messages";
const STYLE =
  "white-space: pre-wrap; overflow-wrap: anywhere; overflow-y: auto; font: 12px/15px sans-serif; " +
  "padding: 4px 6px; border-radius: 4px; box-sizing: border-box; " +
  "color: var(--input-text, #ddd); background: var(--comfy-input-bg, #222);";
const SIDE_MARGINS = 30; // what the frontend leaves of a node's width to a DOM widget, and a little more
const END_MARGINS = 16; // and of its height

// The height the text takes at the node's width, every wrapped line counted: the frontend sizes a DOM widget
// from getMinHeight, and a message cut off hides its fix.
function heightOf(text, width) {
  const probe = document.createElement("div");
  probe.style.cssText = STYLE + `position: absolute; visibility: hidden; left: -10000px; top: 0; width: ${width}px;`;
  probe.textContent = text;
  document.body.appendChild(probe);
  const height = probe.scrollHeight;
  probe.remove();
  return height;
}

function messagesWidget(node) {
  const found = node.widgets?.find((w) => w.name === WIDGET);
  if (found) return found;
  const element = document.createElement("div");
  element.style.cssText = STYLE;
  const widget = node.addDOMWidget(WIDGET, "text", element, {
    serialize: false, // a message is not a setting: never saved into the workflow or sent with a prompt
    hideOnZoom: false,
    getValue: () => element.textContent,
    setValue: () => {},
    getMinHeight: () => widget.textHeight ?? 24,
  });
  widget.serialize = false;
  return widget;
}

function show(node, text) {
  const widget = messagesWidget(node);
  widget.element.textContent = text;
  widget.textHeight = heightOf(text, Math.max(node.size[0] - SIDE_MARGINS, 100)) + END_MARGINS;
  const wanted = node.computeSize();
  node.setSize([Math.max(node.size[0], wanted[0]), Math.max(node.size[1], wanted[1])]);
  node.setDirtyCanvas?.(true, true);
}

app.registerExtension({
  name: "qwen3tts.morph.messages",
  setup() {
    api.addEventListener(EVENT, ({ detail }) => {
      const node = app.graph?.getNodeById(detail.node) ?? app.graph?.getNodeById(Number(detail.node));
      if (node) show(node, detail.text);
    });
  },
});
