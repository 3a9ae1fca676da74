import { parentPort, workerData } from "node:worker_threads"

const tasks = (await import((workerData as { moduleUrl: string }).moduleUrl)) as Record<
  string,
  (input: unknown) => Promise<unknown> | unknown
>

/** Array buffers that belong to one typed array alone, which can be moved to the router thread. */
const ownBuffers = (value: unknown, into: Set<ArrayBuffer>): Set<ArrayBuffer> => {
  if (ArrayBuffer.isView(value)) {
    if (value.buffer instanceof ArrayBuffer && value.byteOffset === 0 && value.byteLength === value.buffer.byteLength)
      into.add(value.buffer)
  } else if (Array.isArray(value)) {
    for (const item of value) ownBuffers(item, into)
  } else if (typeof value === "object" && value !== null) {
    for (const item of Object.values(value)) ownBuffers(item, into)
  }
  return into
}

parentPort!.on("message", async ({ id, task, input }: { id: number; task: string; input: unknown }) => {
  try {
    const run = tasks[task]
    if (typeof run !== "function") throw new Error(`no preprocessing task "${task}"`)
    const value = await run(input)
    parentPort!.postMessage({ id, ok: true, value }, [...ownBuffers(value, new Set())])
  } catch (error) {
    const failure = error instanceof Error ? error : new Error(String(error))
    parentPort!.postMessage({
      id,
      ok: false,
      error: { name: failure.name, message: failure.message, status: (failure as { status?: number }).status }
    })
  }
})
