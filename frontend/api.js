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

/** GET a JSON route; throws ApiError with the server's message on any failure. */
export async function getJSON(route, params = {}, { signal } = {}) {
  let response;
  try {
    response = await fetch(routeUrl(route, params), { signal, cache: "no-store", headers: { Accept: "application/json" } });
  } catch (e) {
    if (isAbort(e)) throw e;
    throw new ApiError(`cannot reach TensorBoard (${e.message}). Is it still running?`, 0, route);
  }
  let body = null;
  try {
    body = await response.json();
  } catch (e) {
    if (isAbort(e)) throw e;
  }
  if (!response.ok) {
    const message = body && typeof body.error === "string" ? body.error : `HTTP ${response.status} ${response.statusText}`;
    throw new ApiError(message, response.status, route);
  }
  if (!body || typeof body !== "object") {
    throw new ApiError(`the '${route}' route sent something that is not a JSON object`, response.status, route);
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
  anomalies: (p, o) => getJSON("anomalies", p, o),
  csvUrl: (p) => routeUrl("csv", p),
};
