/**
 * The engine of an executor (in its router's process): a plain loop that receives requests from the
 * router, asks the scheduler for the next batch, stacks it into shared memory, has the workers run
 * it, and replies. No request parsing or output formatting happens here.
 */
import * as Effect from "effect/Effect"
import { BatchBuffer, batchBufferPathOf, batchSlots } from "./BatchBuffer.js"
import { bindEngineSockets } from "./EngineSockets.js"
import type { ExecutorConfig } from "./ExecutorConfig.js"
import { type ScheduledItem, Scheduler } from "./Scheduler.js"
import { EngineRejected, EngineUnavailable, type ExecutorError } from "./errors.js"
import { type BatchItem, failedMessage, messagesOf, type ToEngine, type ToWorker, type WorkItem } from "./wire.js"
import { startWorkerGroup } from "./WorkerGroup.js"
import { startSpan } from "../../tracing/Tracing.js"
import { runEngineLoops } from "./EngineLoops.js"
import { Wakeup } from "./Wakeup.js"

interface OpenRequest {
  readonly items: ReadonlyArray<WorkItem>
  readonly results: Array<unknown>
  /** When it arrived (performance.now()), and whether it still waits for its first batch. */
  readonly received: number
  waiting: boolean
}

interface RunningBatch {
  readonly slot: number
  readonly scheduled: ReadonlyArray<ScheduledItem<WorkItem>>
  readonly items: ReadonlyArray<BatchItem>
  readonly results: Array<unknown>
  readonly pendingRanks: Set<number>
  readonly shards: Map<number, readonly [number, number]>
}

/**
 * Splits `count` items into one contiguous shard per worker, the larger shards to the workers with
 * the least work outstanding, so that a one-item batch goes to an idle worker.
 */
export const shardItems = (
  count: number,
  outstanding: ReadonlyArray<number>
): Map<number, readonly [number, number]> => {
  const order = outstanding.map((load, rank) => ({ load, rank })).sort((a, b) => a.load - b.load || a.rank - b.rank)
  const shards = new Map<number, readonly [number, number]>()
  const base = Math.floor(count / outstanding.length)
  const extra = count % outstanding.length
  let from = 0
  order.forEach(({ rank }, position) => {
    const size = base + (position < extra ? 1 : 0)
    if (size > 0) shards.set(rank, [from, from + size])
    from += size
  })
  return shards
}

export const runEngine = (config: ExecutorConfig) =>
  Effect.gen(function* () {
    const buffer = yield* BatchBuffer.create(
      batchBufferPathOf(process.pid),
      batchSlots(config.kind),
      config.batchSlotBytes
    )
    const sockets = yield* bindEngineSockets(config)
    const { fromRouter, sendRouter } = sockets

    const scheduler = new Scheduler<WorkItem>({
      maxBatchSize: config.maxBatchSize,
      maxBatchDelayMs: config.maxBatchDelayMs,
      maxQueuedRequests: config.maxQueuedRequests
    })
    const requests = new Map<string, OpenRequest>()
    const batches = new Map<number, RunningBatch>()
    const outstanding = config.devices.map(() => 0)
    /** Wakes the scheduling loop: a new request, a finished batch. */
    const wakeup = new Wakeup()
    let nextBatch = 0

    const failRequest = (id: string, error: ExecutorError) => {
      if (!requests.delete(id)) return
      scheduler.remove(id)
      void sendRouter(failedMessage(id, error))
    }

    const finishBatch = (id: number, failure?: ExecutorError) => {
      const batch = batches.get(id)
      if (batch === undefined) return
      batches.delete(id)
      for (const [rank, [from, to]] of batch.shards) outstanding[rank]! -= to - from
      buffer.release(batch.slot)
      if (failure !== undefined) {
        for (const item of batch.scheduled) failRequest(item.requestId, failure)
      } else {
        batch.scheduled.forEach((item, position) => {
          const request = requests.get(item.requestId)
          if (request !== undefined) request.results[item.index] = batch.results[position]
        })
        for (const id of scheduler.complete(batch.scheduled)) {
          const request = requests.get(id)
          requests.delete(id)
          if (request !== undefined) void sendRouter({ t: "result", id, results: request.results })
        }
      }
      wakeup.wakeAll()
    }

    const workers = yield* startWorkerGroup({
      config,
      sockets,
      replies: {
        partial: (batchId, itemIndex, value) => {
          const item = batches.get(batchId)?.items[itemIndex]
          if (item !== undefined && requests.has(item.requestId)) {
            void sendRouter({ t: "partial", id: item.requestId, item: item.index, value })
          }
        },
        done: (batchId, rank, results) => {
          const batch = batches.get(batchId)
          if (batch === undefined) return
          const [from] = batch.shards.get(rank) ?? [0]
          results.forEach((value, offset) => (batch.results[from + offset] = value))
          batch.pendingRanks.delete(rank)
          if (batch.pendingRanks.size === 0) finishBatch(batchId)
        },
        failed: (batchId, _rank, error) => finishBatch(batchId, error),
        lost: (reason) => {
          for (const id of [...requests.keys()])
            failRequest(id, new EngineUnavailable({ message: `the executor failed: ${reason}` }))
        }
      }
    })

    const dispatch = async (scheduled: ReadonlyArray<ScheduledItem<WorkItem>>) => {
      const slot = await buffer.acquire()
      const batch = nextBatch++
      let layout: ReturnType<BatchBuffer["write"]>
      try {
        layout = buffer.write(
          slot,
          scheduled.map((item) => item.payload)
        )
      } catch (error) {
        buffer.release(slot)
        for (const item of scheduled)
          failRequest(item.requestId, new EngineRejected({ message: (error as Error).message }))
        return
      }
      const items: Array<BatchItem> = scheduled.map((item, position) => ({
        requestId: item.requestId,
        index: item.index,
        meta: item.payload.meta,
        rows: layout.rows[position]!,
        ...(item.payload.trace === undefined ? {} : { trace: item.payload.trace })
      }))
      for (const item of scheduled) {
        const request = requests.get(item.requestId)
        if (request === undefined || !request.waiting) continue
        request.waiting = false
        // Its wait in the engine's queue, from arrival to its first batch.
        startSpan("queue", {
          parent: item.payload.trace,
          startTime: request.received,
          attributes: { "cornserve.batch.size": scheduled.length }
        }).end()
      }
      const shards = shardItems(items.length, outstanding)
      batches.set(batch, {
        slot,
        scheduled,
        items,
        results: new Array(items.length),
        pendingRanks: new Set(shards.keys()),
        shards
      })
      for (const [rank, shard] of shards) {
        outstanding[rank]! += shard[1] - shard[0]
        const message: ToWorker = { t: "batch", batch, inputs: layout.inputs, items, shard }
        workers.send(rank, message)
      }
    }

    const receiveRequests = async (stop: AbortSignal) => {
      for await (const message of messagesOf<ToEngine>(fromRouter)) {
        if (stop.aborted) return
        if (message.t === "worker-lost") workers.lose(message.reason)
        else if (message.t === "cancel") {
          if (requests.delete(message.id)) scheduler.remove(message.id)
          // Items already running: their workers are told, for a model that stops a long stream.
          for (const batch of batches.values()) {
            if (!batch.items.some((item) => item.requestId === message.id)) continue
            for (const rank of batch.pendingRanks) workers.send(rank, { t: "cancel", requestId: message.id })
          }
        } else if (!workers.healthy) {
          void sendRouter(failedMessage(message.id, new EngineUnavailable({ message: "the executor is unhealthy" })))
        } else if (
          !scheduler.enqueue(
            message.id,
            message.items.map((item) => ({ key: item.key, payload: item })),
            Date.now(),
            message.items[0]?.share
          )
        ) {
          void sendRouter(failedMessage(message.id, new EngineUnavailable({ message: "the executor's queue is full" })))
        } else {
          requests.set(message.id, {
            items: message.items,
            results: new Array(message.items.length),
            received: performance.now(),
            waiting: true
          })
          wakeup.wakeAll()
        }
      }
    }

    const schedule = async (stop: AbortSignal) => {
      stop.addEventListener("abort", () => wakeup.wakeAll(), { once: true })
      while (!stop.aborted) {
        if (batches.size >= buffer.slots) {
          await wakeup.wait()
          continue
        }
        const decision = scheduler.next(Date.now())
        if (decision._tag === "Batch") await dispatch(decision.items)
        else await wakeup.wait(decision._tag === "Wait" ? Math.max(1, Math.ceil(decision.ms)) : undefined)
      }
    }

    return yield* runEngineLoops([receiveRequests, schedule])
  })
