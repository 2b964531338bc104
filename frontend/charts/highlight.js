// One run highlighted in a chart (the line charts, the aligned histograms): its marks and legend entry carry
// `lg-hi`, and the chart's svg and legend `lg-dimmed`, so that the stylesheet fades the others.

/**
 * Mark `marks` (the elements of series `key`; null: none) as highlighted in `chart` ({root, svg, legend}).
 * The caller brings them forward: what "on top" means is the chart's.
 */
export function markHighlighted(chart, key, marks) {
  chart.svg.classList.toggle("lg-dimmed", Boolean(marks));
  chart.legend.classList.toggle("lg-dimmed", Boolean(marks));
  for (const el of chart.root.querySelectorAll(".lg-hi")) el.classList.remove("lg-hi");
  if (!marks) return;
  for (const el of marks) el.classList.add("lg-hi");
  for (const item of chart.legend.children) if (item.dataset.key === key) item.classList.add("lg-hi");
}
