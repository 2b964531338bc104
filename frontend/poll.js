// Auto-refresh while runs are written. TensorBoard's reload button does not reach
// plugin iframes, and it hides (height 0) rather than destroys the iframe of a tab
// that is not shown: poll, but only while this tab is visible, and catch up at
// once when it is shown again.

/** True while the tab can be seen: browser tab shown, iframe laid out with a size. */
export function tabVisible() {
  if (document.hidden) return false;
  if (window.innerWidth === 0 || window.innerHeight === 0) return false;
  try {
    const fe = window.frameElement;
    if (fe && typeof fe.checkVisibility === "function" && !fe.checkVisibility({ visibilityProperty: true })) return false;
  } catch {
    // cross-origin parent: rely on the checks above
  }
  return true;
}

export class Poller {
  /**
   * @param {() => Promise<void>} fn  the refresh; never run twice at once
   * @param {number} intervalMs       time between refreshes while visible
   */
  constructor(fn, intervalMs) {
    this.fn = fn;
    this.intervalMs = intervalMs;
    this.last = Date.now();
    this.running = false;
    this.timer = setInterval(() => this.tick(), Math.min(1000, intervalMs));
    document.addEventListener("visibilitychange", () => this.tick());
  }

  setInterval(ms) {
    this.intervalMs = ms;
  }

  async tick(force = false) {
    if (this.running || !tabVisible()) return;
    if (!force && Date.now() - this.last < this.intervalMs) return;
    this.running = true;
    try {
      await this.fn();
    } finally {
      this.last = Date.now();
      this.running = false;
    }
  }

  stop() {
    clearInterval(this.timer);
  }
}
