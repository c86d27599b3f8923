// The report's `qat` section (quantization-aware training): the outcome, and per epoch the training loss and
// the held-out SQNR against FP32 as one chart with an axis each (epoch 0 is the post-training model, which has
// a held-out SQNR but no training loss), the same numbers in a table, as the HTML report draws them.

import type { Schemas } from "./api/client";
import { chart, PALETTE } from "./charts";
import { h, num, scroll, table } from "./dom";

type Qat = Schemas["Qat"];

function statement(qat: Qat): string {
  if (qat.reason) return `${qat.status}: ${qat.reason}`;
  const sqnr = qat.heldout_sqnr_db;
  return `${qat.status}: held-out SQNR ${num(sqnr.before, 2)} → ${num(sqnr.after, 2)} dB, epoch ${qat.best_epoch} kept, ${num(qat.seconds, 1)} s on ${qat.device}`;
}

export function qatView(qat: Qat): { el: HTMLElement; destroy: () => void } {
  const curve = qat.curve;
  const epochs = [0, ...curve.map((p) => p.epoch)];
  const loss = [null, ...curve.map((p) => p.loss)];
  const sqnr = [qat.heldout_sqnr_db.before, ...curve.map((p) => p.heldout_sqnr_db)];
  const description =
    "QAT per epoch, training loss and held-out SQNR (dB): " +
    epochs.map((epoch, i) => `epoch ${epoch} ${loss[i] === null ? "" : `loss ${num(loss[i], 4)}, `}SQNR ${num(sqnr[i], 2)}`).join("; ");
  const view = curve.length
    ? chart(
        {
          type: "line",
          data: {
            labels: epochs.map(String),
            datasets: [
              { label: "Training loss (mean over the epoch)", data: loss, yAxisID: "loss", borderColor: PALETTE[1], backgroundColor: PALETTE[1] },
              { label: "Held-out SQNR (dB)", data: sqnr, yAxisID: "sqnr", borderColor: PALETTE[0], backgroundColor: PALETTE[0] },
            ],
          },
          options: {
            plugins: { legend: { position: "bottom" } },
            scales: {
              x: { title: { display: true, text: "Epoch (0: the post-training model)" } },
              loss: { type: "linear", position: "left", title: { display: true, text: "Training loss" } },
              sqnr: { type: "linear", position: "right", title: { display: true, text: "Held-out SQNR (dB)" }, grid: { drawOnChartArea: false } },
            },
          },
        },
        description,
      )
    : null;
  const rows = curve.map((p) => [String(p.epoch), String(p.steps), num(p.loss, 4), num(p.heldout_sqnr_db, 2)]);
  const options = [
    `loss ${qat.loss}`,
    qat.label_weight ? `label weight ${qat.label_weight}` : null,
    qat.augment && (qat.augment.flip || qat.augment.crop_padding) ? `augmented (${[qat.augment.flip ? "flips" : null, qat.augment.crop_padding ? `crops ±${qat.augment.crop_padding} px` : null].filter(Boolean).join(", ")})` : null,
    qat.intermediate?.length ? `intermediate tensors ${qat.intermediate.join(", ")}` : null,
  ].filter(Boolean);
  const el = h(
    "section",
    { "aria-labelledby": "qat-title", id: "qat" },
    h("h3", { id: "qat-title" }, "Quantization-aware training"),
    h("p", { class: `notice ${qat.status === "trained" ? "info" : "warn"}`, role: "status", id: "qat-statement" }, statement(qat)),
    h("p", { class: "hint" }, `${qat.num_train} samples trained on, ${qat.num_heldout} held out; ${options.join("; ")}.`),
    ...(view ? [view.el] : []),
    scroll("QAT per epoch", table(null, ["Epoch", "Steps", "Training loss", "Held-out SQNR (dB)"], rows, { class: "data compact", id: "qat-curve" })),
  );
  return { el, destroy: () => view?.destroy() };
}
