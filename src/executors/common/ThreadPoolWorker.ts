import { parentPort, workerData } from "node:worker_threads"
import { Schema } from "effect"
import { MediaFailure } from "./media/errors.js"
import type { ThreadReply } from "./ThreadPool.js"

const tasks = (await import((workerData as { moduleUrl: string }).moduleUrl)) as Record<
  string,
  (input: unknown) => Promise<unknown> | unknown
>

const reply = (message: ThreadReply, transfer: ReadonlyArray<ArrayBuffer> = []) =>
  parentPort!.postMessage(message, transfer)
const isMediaFailure = Schema.is(MediaFailure)
const encodeMediaFailure = Schema.encodeSync(MediaFailure)

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
    reply({ id, ok: true, value }, [...ownBuffers(value, new Set())])
  } catch (error) {
    if (isMediaFailure(error)) return reply({ id, ok: false, mediaFailure: encodeMediaFailure(error) })
    const failure = error instanceof Error ? error : new Error(String(error))
    reply({ id, ok: false, error: { name: failure.name, message: failure.message } })
  }
})
