/**
 * The machine's memory read bandwidth as a decode step meets it: `threads` threads each scan
 * their share of a buffer of `bytes` (memchr over bytes it never finds, which reads at the
 * memory's speed), best of a few passes. Answers bytes per second. A buffer of at most 1 GiB,
 * far past any cache, stands for the weights of larger models (no typed array holds 6 GB).
 */
import { Worker } from "node:worker_threads"

const scanner = `
const { parentPort, workerData } = require("node:worker_threads")
const view = Buffer.from(workerData.buffer, workerData.offset, workerData.length)
parentPort.on("message", () => {
  const found = view.indexOf(1)
  parentPort.postMessage(found)
})
`

export const readBandwidth = async (weightBytes: number, threads = 2, passes = 5): Promise<number> => {
  const bytes = Math.min(weightBytes, 2 ** 30)
  const shared = new SharedArrayBuffer(bytes)
  // Touch every page (2 everywhere), so that the scan reads memory and not the zero page.
  new Uint8Array(shared).fill(2)
  const share = Math.floor(bytes / threads)
  const workers = Array.from(
    { length: threads },
    (_, index) =>
      new Worker(scanner, { eval: true, workerData: { buffer: shared, offset: index * share, length: share } })
  )
  const scan = () =>
    Promise.all(
      workers.map(
        (worker) =>
          new Promise<void>((resolve) => {
            worker.once("message", () => resolve())
            worker.postMessage(0)
          })
      )
    )
  try {
    await scan()
    let best = Infinity
    for (let pass = 0; pass < passes; pass++) {
      const started = performance.now()
      await scan()
      best = Math.min(best, performance.now() - started)
    }
    return (share * threads) / (best / 1000)
  } finally {
    await Promise.all(workers.map((worker) => worker.terminate()))
  }
}
