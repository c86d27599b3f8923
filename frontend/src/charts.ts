// Chart.js, with only the pieces the dashboard draws registered (keeps the bundle small).
// Every chart is an <img>-role canvas with a text label; the same numbers are always in a table too.

import {
  BarController,
  BarElement,
  CategoryScale,
  Chart,
  Legend,
  LinearScale,
  PointElement,
  ScatterController,
  Tooltip,
  type ChartConfiguration,
} from "chart.js";
import { h } from "./dom";

Chart.register(BarController, BarElement, CategoryScale, LinearScale, PointElement, ScatterController, Tooltip, Legend);
Chart.defaults.animation = false;
Chart.defaults.font.family = "system-ui, sans-serif";
Chart.defaults.color = "#1f2937";

export const PALETTE = ["#1d4ed8", "#b45309", "#047857", "#7c3aed", "#be123c", "#0e7490", "#4d7c0f", "#9d174d"];

/** A chart in a sized container; returns the container and a destroy function for page cleanup. */
export function chart(config: ChartConfiguration, description: string, height = 280): { el: HTMLElement; destroy: () => void } {
  const canvas = h("canvas", { role: "img", "aria-label": description });
  const el = h("div", { class: "chart", style: `height: ${height}px` }, canvas);
  config.options = { responsive: true, maintainAspectRatio: false, ...config.options };
  let instance: Chart | null = null;
  // Charts measure their container, so create them once it is in the document.
  requestAnimationFrame(() => {
    if (canvas.isConnected) instance = new Chart(canvas, config);
  });
  return { el, destroy: () => instance?.destroy() };
}
