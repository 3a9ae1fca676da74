/**
 * Loads a GGUF file in llama.cpp (node-llama-cpp's prebuilt CPU binary) in a process of its own,
 * and prints what loading cost as one JSON line: the time to a loaded model and context, the
 * time to its first generated token (one token of a short prompt), and the process's peak
 * resident memory (VmHWM). The models bench runs it beside the executor's own load.
 *
 * Usage: node bench/support/llamaLoad.mjs FILE THREADS SEQUENCES POSITIONS
 */
import { readFileSync } from "node:fs"
import { getLlama } from "node-llama-cpp"

const [path, threads, sequences, positions] = process.argv.slice(2)
const peakRss = () => Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"))[1]) * 1024
const baseline = peakRss()
const start = performance.now()
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" })
const model = await llama.loadModel({ modelPath: path })
const context = await model.createContext({
  contextSize: Number(sequences) * Number(positions),
  sequences: Number(sequences),
  threads: Number(threads),
  batchSize: 512
})
const loadedMs = performance.now() - start
const sequence = context.getSequence()
for await (const token of sequence.evaluate([1, 2, 3, 4], { temperature: 0 })) {
  void token
  break
}
const firstTokenMs = performance.now() - start
console.log(JSON.stringify({ loadedMs, firstTokenMs, peakRssBytes: peakRss(), baselineRssBytes: baseline }))
await context.dispose()
await model.dispose()
await llama.dispose()
