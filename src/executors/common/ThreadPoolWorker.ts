import { parentPort, workerData } from "node:worker_threads"
import * as Schema from "effect/Schema"
import { MediaFailure } from "./media/errors.js"
import { runAsJob } from "./ThreadJob.js"
import type { ThreadData, ThreadReply, ThreadRequest } from "./ThreadPool.js"

const { moduleUrl, scratchDir } = workerData as ThreadData
const tasks = (await import(moduleUrl)) as Record<string, (input: unknown) => Promise<unknown> | unknown>

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

/** The jobs this thread runs, by id: a cancelled one's signal aborts, and nobody waits for its answer. */
const running = new Map<number, AbortController>()

const run = async (id: number, task: string, input: unknown) => {
  const cancel = new AbortController()
  running.set(id, cancel)
  try {
    const work = tasks[task]
    if (typeof work !== "function") throw new Error(`no preprocessing task "${task}"`)
    const value = await runAsJob({ signal: cancel.signal, scratchDir }, () => work(input))
    if (!cancel.signal.aborted) reply({ id, ok: true, value }, [...ownBuffers(value, new Set())])
  } catch (error) {
    if (cancel.signal.aborted) return
    if (isMediaFailure(error)) return reply({ id, ok: false, mediaFailure: encodeMediaFailure(error) })
    const failure = error instanceof Error ? error : new Error(String(error))
    reply({ id, ok: false, error: { name: failure.name, message: failure.message } })
  } finally {
    running.delete(id)
  }
}

parentPort!.on("message", (request: ThreadRequest) => {
  if (request.type === "cancel") running.get(request.id)?.abort(new Error("the job's request ended"))
  else void run(request.id, request.task, request.input)
})
