// Fetching the plugin's JSON routes (docs/HTTP_API.md). Relative URLs only: the
// iframe page has <base href="plugin/layergrad/">, so "./runs" works under
// --path_prefix and /experiment/<eid>/ alike.

export const API_VERSION = 1;

export class ApiError extends Error {
  constructor(message, status = 0, route = "") {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.route = route;
  }
}

export function isAbort(e) {
  return Boolean(e) && e.name === "AbortError";
}

/** "./route?k=v&..." — arrays repeat the key, empty values are left out. */
export function routeUrl(route, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    if (Array.isArray(v)) for (const x of v) q.append(k, String(x));
    else q.append(k, String(v));
  }
  const qs = q.toString();
  return `./${route}${qs ? `?${qs}` : ""}`;
}

// Reason phrases for when the browser gives none (HTTP/2 answers have an empty statusText).
const REASONS = {
  400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
  408: "Request Timeout", 413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
  501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
};

function statusLine(response) {
  const reason = response.statusText || REASONS[response.status] || "";
  return `HTTP ${response.status}${reason ? ` ${reason}` : ""}`;
}

/** What a body that is not the plugin's JSON looks like, in words (never its markup). */
function describeBody(response, text) {
  const type = (response.headers.get("Content-Type") || "").split(";")[0].trim().toLowerCase();
  if (!text.trim()) return "an empty answer";
  if (type === "text/html" || /^\s*<(!doctype|html|head|body)/i.test(text)) return "an HTML page instead of the plugin's JSON (from a proxy in between, or from TensorBoard itself)";
  return `${type || "an answer"} that is not the plugin's JSON`;
}

/** True for failures that may go away by themselves (no connection, a 5xx): worth asking again. */
export function isTransient(e) {
  return e instanceof ApiError && (e.status === 0 || e.status >= 500);
}

/** GET a JSON route; throws ApiError with the server's message on any failure. */
export async function getJSON(route, params = {}, { signal } = {}) {
  const unreachable = (e) => new ApiError(`cannot reach TensorBoard (${e && e.message ? e.message : e}). Is it still running?`, 0, route);
  let response;
  let text;
  try {
    response = await fetch(routeUrl(route, params), { signal, cache: "no-store", headers: { Accept: "application/json" } });
    text = await response.text();
  } catch (e) {
    if (isAbort(e)) throw e;
    throw unreachable(e); // no answer, or the connection broke while the body came
  }
  // Parse the text ourselves: response.json() on an HTML error page throws a SyntaxError
  // ("Unexpected token '<'") that says nothing to the person looking at the tab.
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!response.ok) {
    const message = body && typeof body.error === "string" ? body.error : `${statusLine(response)}: ${describeBody(response, text)}`;
    throw new ApiError(message, response.status, route);
  }
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new ApiError(`the '${route}' route sent ${body === null ? describeBody(response, text) : "JSON that is not an object"}`, response.status, route);
  }
  if (body.api_version !== API_VERSION) {
    throw new ApiError(
      `this tab speaks layergrad API version ${API_VERSION} but the server answers version ${body.api_version}: ` +
        "the tab and the plugin come from different tb_layergrad installs",
      response.status,
      route,
    );
  }
  return body;
}

/** The routes, one function each; `p` holds the query parameters. */
export const api = {
  runs: (p = {}, o) => getJSON("runs", p, o),
  matrix: (p, o) => getJSON("matrix", p, o),
  stats: (p, o) => getJSON("stats", p, o),
  histograms: (p, o) => getJSON("histograms", p, o),
  tensor: (p, o) => getJSON("tensor", p, o),
  timesteps: (p, o) => getJSON("timesteps", p, o),
  compare: (p, o) => getJSON("compare", p, o),
  depth: (p, o) => getJSON("depth", p, o),
  histogramsAt: (p, o) => getJSON("histograms_at", p, o),
  anomalies: (p, o) => getJSON("anomalies", p, o),
  examples: (p, o) => getJSON("examples", p, o),
  noiseScale: (p, o) => getJSON("noise_scale", p, o),
  hparams: (p = {}, o) => getJSON("hparams", p, o),
  sweep: (p, o) => getJSON("sweep", p, o),
  csvUrl: (p) => routeUrl("csv", p),
};
