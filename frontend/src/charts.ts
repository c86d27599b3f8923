// Chart.js, with only the pieces the dashboard draws registered (keeps the bundle small).
// Every chart is an <img>-role canvas with a text label; the same numbers are always in a table too.

import {
  BarController,
  BarElement,
  CategoryScale,
  Chart,
  Legend,
  LinearScale,
  LineController,
  LineElement,
  PointElement,
  ScatterController,
  Tooltip,
  type ChartConfiguration,
} from "chart.js";
import { h } from "./dom";

Chart.register(BarController, BarElement, CategoryScale, LinearScale, LineController, LineElement, PointElement, ScatterController, Tooltip, Legend);
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

export interface ScatterPoint {
  label: string; // the legend entry: one per point, so every point is named
  x: number;
  y: number;
  radius?: number;
  hollow?: boolean; // drawn as a ring: a point the reader should look past
}

/** A scatter of named points, each its own legend entry, in PALETTE order. */
export function scatter(points: ScatterPoint[], axes: { x: string; y: string; yMax?: number }, description: string, height = 320): { el: HTMLElement; destroy: () => void } {
  return chart(
    {
      type: "scatter",
      data: {
        datasets: points.map((point, i) => ({
          label: point.label,
          data: [{ x: point.x, y: point.y }],
          backgroundColor: point.hollow ? "#ffffff" : PALETTE[i % PALETTE.length],
          borderColor: PALETTE[i % PALETTE.length],
          borderWidth: 2,
          pointRadius: point.radius ?? 6,
          clip: false as const, // a point at 100 % sits on the edge: draw it whole
        })),
      },
      options: {
        plugins: { legend: { position: "bottom" } },
        scales: {
          x: { title: { display: true, text: axes.x } },
          y: { title: { display: true, text: axes.y }, ...(axes.yMax === undefined ? {} : { max: axes.yMax }) },
        },
      },
    },
    description,
    height,
  );
}
