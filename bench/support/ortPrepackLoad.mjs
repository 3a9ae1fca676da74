/**
 * Loads a decoder-only ONNX export in ONNX Runtime (the CPU provider, with the session options the
 * executor's sessions have: THREADS intra-op threads, one inter-op, every graph optimization) in a
 * process of its own, and prints what it cost as one JSON line: the time to a session, the peak
 * and current resident memory (VmHWM, VmRSS), and the time of a one-token step with an empty past,
 * first and the median of the last 15 of 25. The models bench's prepack part runs it three ways:
 *
 * - plain: MODEL as it is; ONNX Runtime packs each MatMul's weights into fresh memory as it loads;
 * - save: the same, and ONNX Runtime writes the optimized model, its packed weights beside the
 *   originals, to OUT (`session.save_external_prepacked_constant_initializers`);
 * - saved: OUT, whose packed weights ONNX Runtime maps from the file instead of packing them.
 *
 * Usage: node bench/support/ortPrepackLoad.mjs plain|save|saved MODEL OUT THREADS KV_HEADS HEAD_DIM PAST_TYPE
 */
import { readFileSync, statSync } from "node:fs"
import { basename, dirname, join } from "node:path"
import * as ort from "onnxruntime-node"

const [mode, model, out, threads, kvHeads, headDim, pastType] = process.argv.slice(2)
process.env.ORT_DISABLE_TELEMETRY ??= "1"
const status = (field) =>
  Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync("/proc/self/status", "utf8"))[1]) * 1024
const dataName = `${basename(out)}_data`
const options = {
  executionProviders: ["cpu"],
  intraOpNumThreads: Number(threads),
  interOpNumThreads: 1,
  graphOptimizationLevel: "all",
  ...(mode === "save" ? { optimizedModelFilePath: out } : {}),
  extra: {
    session:
      mode === "save"
        ? {
            save_external_prepacked_constant_initializers: "1",
            optimized_model_external_initializers_file_name: dataName,
            optimized_model_external_initializers_min_size_in_bytes: "1024"
          }
        : {}
  }
}
const start = performance.now()
const session = await ort.InferenceSession.create(mode === "saved" ? out : model, options)
const createMs = performance.now() - start
const peakRssBytes = status("VmHWM")
const rssBytes = status("VmRSS")
const empty = pastType === "float16" ? new Uint16Array(0) : new Float32Array(0)
const feeds = {}
for (const name of session.inputNames) {
  if (name === "input_ids") feeds[name] = new ort.Tensor("int64", BigInt64Array.from([1000n]), [1, 1])
  else if (name === "attention_mask") feeds[name] = new ort.Tensor("int64", BigInt64Array.from([1n]), [1, 1])
  else if (name === "position_ids") feeds[name] = new ort.Tensor("int64", BigInt64Array.from([0n]), [1, 1])
  else feeds[name] = new ort.Tensor(pastType, empty, [1, Number(kvHeads), 0, Number(headDim)])
}
const steps = []
for (let i = 0; i < 25; i++) {
  const at = performance.now()
  await session.run(feeds)
  steps.push(performance.now() - at)
}
const last = steps.slice(10).sort((a, b) => a - b)
const savedBytes = mode === "save" ? statSync(out).size + statSync(join(dirname(out), dataName)).size : 0
console.log(
  JSON.stringify({
    createMs,
    peakRssBytes,
    rssBytes,
    firstStepMs: steps[0],
    stepMs: last[Math.floor(last.length / 2)],
    savedBytes
  })
)
await session.release()
