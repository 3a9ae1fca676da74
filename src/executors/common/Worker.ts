/**
 * A worker of an executor (its own process, one per device): loads the kind's model on its device,
 * then runs its share of every batch the engine hands it, reading the inputs in place from the
 * engine's batch buffer (the batch engine's; the LLM's steps carry what they need in the message).
 */
import * as zmq from "zeromq"
import { BatchBuffer, batchBufferEnvName, batchSlots } from "./BatchBuffer.js"
import { exitWithParent } from "../../process/ChildProcesses.js"
import { type ExecutorConfig, ipcPath } from "./ExecutorConfig.js"
import type { LoadWorkerModel } from "./WorkerModel.js"
import { yieldPriority } from "./EarlySpawn.js"
import {
  type BatchItem,
  type BatchMessage,
  messagesOf,
  type FromWorker,
  orderedSender,
  type ToWorker,
  workerFailedMessage
} from "./wire.js"
import { type Span, startSpan } from "../../tracing/Tracing.js"

/**
 * Each kind's worker module is `executors/<kind>/worker.ts`, loaded only in that kind's workers
 * (named one by one so that a bundler sees them).
 */
const kindWorkers: Record<ExecutorConfig["kind"], () => Promise<{ readonly load: LoadWorkerModel }>> = {
  llm: () => import("../llm/worker.js"),
  eric: () => import("../eric/worker.js"),
  geri: () => import("../geri/worker.js")
}
const loadKind = (kind: ExecutorConfig["kind"]) => kindWorkers[kind]()

export const runWorker = async (config: ExecutorConfig, rank: number): Promise<void> => {
  exitWithParent()
  const device = config.devices[rank]
  if (device === undefined) throw new Error(`worker ${rank} has no device (devices: ${config.devices.join(", ")})`)
  const { load } = await loadKind(config.kind)
  const model = await load({ config, rank, device })
  yieldPriority()
  // Mapped at the first batch with inputs: this worker may have started before its engine made it
  // (see EarlySpawn), and a worker whose batches carry their inputs in their messages never maps it.
  const bufferPath = process.env[batchBufferEnvName]
  let buffer: BatchBuffer | undefined
  const inputsOf = (message: BatchMessage, firstRow: number, lastRow: number) => {
    const inputs = Object.entries(message.inputs)
    if (inputs.length === 0) return {}
    if (bufferPath === undefined)
      throw new Error(`batch ${message.batch} has inputs, but the engine has no batch buffer`)
    buffer ??= BatchBuffer.open(bufferPath, batchSlots(config.kind), config.batchSlotBytes)
    const opened = buffer
    return Object.fromEntries(inputs.map(([name, input]) => [name, opened.read(input, firstRow, lastRow)]))
  }
  const fromEngine = new zmq.Pull()
  const toEngine = new zmq.Push({ linger: 1_000 })
  fromEngine.connect(ipcPath(config, `worker-${rank}`))
  toEngine.connect(ipcPath(config, "workers-out"))
  const send = orderedSender<FromWorker>(toEngine)
  await send({ t: "ready", rank })
  /** Requests with items in a running batch (how many items), and those of them cancelled. */
  const runningRequests = new Map<string, number>()
  const cancelledRequests = new Set<string>()
  const runBatch = async (message: BatchMessage) => {
    const [from, to] = message.shard
    const items = message.items.slice(from, to)
    for (const item of items) runningRequests.set(item.requestId, (runningRequests.get(item.requestId) ?? 0) + 1)
    try {
      await runItems(message, from, items)
    } finally {
      for (const item of items) {
        const left = runningRequests.get(item.requestId)! - 1
        if (left > 0) runningRequests.set(item.requestId, left)
        else {
          runningRequests.delete(item.requestId)
          cancelledRequests.delete(item.requestId)
        }
      }
    }
  }
  const runItems = async (message: BatchMessage, from: number, items: ReadonlyArray<BatchMessage["items"][number]>) => {
    const firstRow = items[0]!.rows[0]
    const lastRow = items[items.length - 1]!.rows[1]
    const spans = model.tracesItsItems === true ? new Map<string, Span>() : computeSpans(items, rank)
    try {
      const results = await model.run({
        inputs: inputsOf(message, firstRow, lastRow),
        items: items.map((item) => {
          const trace = spans.get(item.requestId)?.traceparent ?? item.trace
          return {
            ...item,
            rows: [item.rows[0] - firstRow, item.rows[1] - firstRow] as const,
            ...(trace === undefined ? {} : { trace })
          }
        }),
        emit: (item, value) => void send({ t: "partial", batch: message.batch, item: from + item, value }),
        cancelled: (item) => cancelledRequests.has(items[item]!.requestId)
      })
      for (const span of spans.values()) span.end()
      await send({ t: "done", batch: message.batch, rank, results })
    } catch (error) {
      for (const span of spans.values()) span.end(error)
      await send(
        workerFailedMessage(
          message.batch,
          rank,
          error instanceof Error ? error.message : String(error),
          receiverGone(error)
        )
      )
    }
  }
  // A model that runs batches side by side gets each as it comes; the others, one after another.
  const running = new Set<Promise<void>>()
  for await (const message of messagesOf<ToWorker>(fromEngine)) {
    if (message.t === "stop") break
    if (message.t === "cancel") {
      // Only a request still running is remembered: a late cancel leaves nothing behind.
      if (runningRequests.has(message.requestId)) cancelledRequests.add(message.requestId)
      continue
    }
    if (model.concurrentBatches !== true) {
      await runBatch(message)
      continue
    }
    const batch = runBatch(message).finally(() => running.delete(batch))
    running.add(batch)
  }
  await Promise.all(running)
  await model.close()
  fromEngine.close()
  toEngine.close()
}

/** One span per traced request among a batch's items: its compute on this worker's device. */
const computeSpans = (items: ReadonlyArray<BatchItem>, rank: number): Map<string, Span> => {
  const spans = new Map<string, Span>()
  for (const item of items) {
    if (item.trace === undefined || spans.has(item.requestId)) continue
    spans.set(
      item.requestId,
      startSpan("compute", {
        parent: item.trace,
        attributes: { "cornserve.batch.items": items.length, "cornserve.worker.rank": rank }
      })
    )
  }
  return spans
}

/**
 * The output could not reach a consumer's node: its sidecar went away or is no longer a peer (the
 * node was lost). The work can be done again once the consumer runs elsewhere: the executor is
 * unavailable for this request, not failed.
 */
const receiverGone = (error: unknown): boolean => {
  const tag = (error as { readonly _tag?: unknown } | null)?._tag
  return tag === "PeerUnavailable" || tag === "UnknownNode"
}
