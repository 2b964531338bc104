// Colour maps and palettes. Packed colours are 0xAABBGGRR (ImageData's byte order
// seen through a Uint32Array on little-endian machines, i.e. all of them in practice).

function hexToRgb(hex) {
  const n = parseInt(hex.slice(1), 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

function lut(stops, size = 256) {
  const rgb = stops.map(hexToRgb);
  const out = new Uint32Array(size);
  const css = new Array(size);
  for (let k = 0; k < size; k++) {
    const t = (k / (size - 1)) * (rgb.length - 1);
    const a = Math.min(rgb.length - 2, Math.floor(t));
    const f = t - a;
    const c = [0, 1, 2].map((x) => Math.round(rgb[a][x] + (rgb[a + 1][x] - rgb[a][x]) * f));
    out[k] = pack(c[0], c[1], c[2]);
    css[k] = `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  return { packed: out, css };
}

export function pack(r, g, b, a = 255) {
  return ((a << 24) | (b << 16) | (g << 8) | r) >>> 0;
}

export function packHex(hex) {
  const [r, g, b] = hexToRgb(hex);
  return pack(r, g, b);
}

// Viridis (matplotlib's perceptually uniform map), 10 stops interpolated.
export const VIRIDIS = lut(["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"]);
// Red-blue diverging map for signed values (raw tensors), white at zero.
export const RDBU = lut(["#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b"]);

export const COLORS = {
  nonfinite: "#e4002b",
  zero: "#a3a3a3",
  missing: "#f1f1f1",
  nan: "#e7298a",
  inf: "#000000",
  vanishing: "#2979ff",
  exploding: "#ff6d00",
  dead: "#616161",
  accent: "#f57c00",
  // The chosen step (chart marker, highlighted histogram, slider): no series, run or flag has this colour.
  selected: "#212121",
};

// Distinct, colour-blind-friendly colours for runs and series, assigned by position.
// Red comes last: red means NaN/Inf in this tab.
export const PALETTE = ["#1f77b4", "#e8710a", "#2ca02c", "#9467bd", "#00a3b4", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#d62728"];

export function paletteColor(i) {
  return PALETTE[((i % PALETTE.length) + PALETTE.length) % PALETTE.length];
}

/** Index into a LUT for t in [0, 1]. */
export function lutIndex(t, size = 256) {
  if (!(t > 0)) return 0;
  if (t >= 1) return size - 1;
  return Math.round(t * (size - 1));
}
