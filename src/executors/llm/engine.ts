/**
 * The LLM executor's engine (in its router's process): continuous batching. One loop per worker (a lane)
 * asks the scheduler, at every step boundary, which requests join and which go on, sends the step,
 * and waits for it; tokens stream from the worker through here to the router as they are sampled.
 * A request finishes when its worker says so (end of sequence or max tokens) or when the router
 * cancels it; either way it leaves the batch and its KV cache is freed.
 */
import * as Effect from "effect/Effect"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { bindEngineSockets } from "../common/EngineSockets.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import { EngineRejected, EngineUnavailable, type ExecutorError, ExecutorFailed } from "../common/errors.js"
import { type BatchItem, failedMessage, messagesOf, type ToEngine, type ToWorker } from "../common/wire.js"
import { startWorkerGroup } from "../common/WorkerGroup.js"
import type { LlmStats } from "./api.js"
import { kvBudget } from "./Limits.js"
import {
  cachePositions,
  type EmbedMeta,
  type EmbedResult,
  type GenerateMeta,
  type GenerateResult,
  type KvExportMeta,
  type KvImportMeta,
  type KvResult,
  type LlmRequestMeta,
  type StepOp,
  type TokenPartial,
  type WorkerStats
} from "./protocol.js"
import { ContinuousScheduler } from "./Scheduler.js"
import type { Share } from "../common/FairShare.js"
import { startSpan } from "../../tracing/Tracing.js"
import { runEngineLoops } from "../common/EngineLoops.js"
import { Wakeup } from "../common/Wakeup.js"

/** Steps a lane has sent to its worker and not seen end, at most. */
const stepsAhead = 2

type OpenRequest = (
  | { readonly op: "generate"; readonly meta: GenerateMeta; generated: number }
  /** An embedding or a KV export: one lane's, the first to take it. */
  | { readonly op: "embed"; readonly meta: EmbedMeta | KvExportMeta }
  /** Asked of every lane's worker; answered when all have. */
  | { readonly op: "stats"; readonly answers: Map<number, WorkerStats> }
  /** Put into every lane's prefix cache; answered when all have. */
  | { readonly op: "kv-import"; readonly meta: KvImportMeta; readonly answers: Map<number, KvResult> }
) & {
  /** Its router's span (see WorkItem.trace), and when it arrived (performance.now()). */
  readonly trace: string | undefined
  readonly received: number
}

interface RunningStep {
  readonly lane: number
  readonly items: ReadonlyArray<BatchItem>
  readonly done: () => void
}

export const runEngine = (config: ExecutorConfig) =>
  Effect.gen(function* () {
    const model = yield* Effect.tryPromise({
      try: () => loadModelDirectory(config.modelDir),
      catch: (error) => error as Error
    })
    const sockets = yield* bindEngineSockets(config)
    const { fromRouter, sendRouter } = sockets

    const budget = yield* Effect.try({ try: () => kvBudget(config, model), catch: (error) => error as Error })
    const scheduler = new ContinuousScheduler({
      lanes: config.devices.length,
      maxRunning: config.maxBatchSize,
      kvCache: budget,
      maxQueuedRequests: config.maxQueuedRequests
    })
    const requests = new Map<string, OpenRequest>()
    const embedQueue: Array<string> = []
    /** Stats requests and KV imports each lane's worker has yet to be given. */
    const statsQueues = config.devices.map(() => [] as Array<string>)
    /** Requests whose cache a lane's worker may still hold though they left the batch. */
    const frees = config.devices.map(() => new Set<string>())
    const steps = new Map<number, RunningStep>()
    /** Wakes every lane that waits for work. */
    const wakeup = new Wakeup()
    const counts = { finished: 0, cancelled: 0, largestBatch: 0 }
    let nextStep = 0

    const finish = (id: string, result: GenerateResult) => {
      requests.delete(id)
      scheduler.release(id)
      counts.finished++
      void sendRouter({ t: "result", id, results: [result] })
      wakeup.wakeAll()
    }

    const fail = (id: string, error: ExecutorError) => {
      const request = requests.get(id)
      if (request === undefined) return
      requests.delete(id)
      const placement = scheduler.release(id)
      if (placement?._tag === "Running") frees[placement.lane]!.add(id)
      void sendRouter(failedMessage(id, error))
      wakeup.wakeAll()
    }

    /** The engine's counts, with the workers' prefix caches summed. */
    const stats = (answers: Iterable<WorkerStats>): LlmStats => {
      const { waiting, running, usedTokens, reservedBytes } = scheduler.stats
      const workers = [...answers]
      const caches = workers.flatMap((answer) => (answer.prefixCache === undefined ? [] : [answer.prefixCache]))
      const sum = (field: keyof (typeof caches)[number]) => caches.reduce((total, cache) => total + cache[field], 0)
      const prefixCache =
        caches.length === 0
          ? undefined
          : {
              lookups: sum("lookups"),
              hits: sum("hits"),
              hitTokens: sum("hitTokens"),
              blocks: sum("blocks"),
              bytes: sum("bytes"),
              maxBytes: sum("maxBytes"),
              evictions: sum("evictions")
            }
      const layouts = workers.flatMap((answer) => (answer.kvCache === undefined ? [] : [answer.kvCache]))
      const layout = layouts[0]
      const imports = workers.flatMap((answer) => (answer.kvImports === undefined ? [] : [answer.kvImports]))
      const clocks = workers.flatMap((answer) => (answer.steps === undefined ? [] : [answer.steps]))
      const clockSum = (field: keyof (typeof clocks)[number]) =>
        clocks.reduce((total, clock) => total + clock[field], 0)
      return {
        waiting: waiting + embedQueue.length,
        running,
        maxBatchSize: config.maxBatchSize,
        ...(config.prefillChunkTokens === undefined ? {} : { prefillChunkTokens: config.prefillChunkTokens }),
        kvCache: {
          usedTokens,
          budgetBytes: budget.totalBytes,
          prefixBytes: budget.prefixBytes,
          bytesPerPosition: budget.bytesPerPosition,
          reservedBytes,
          ...(layout === undefined
            ? {}
            : {
                mode: layout.mode,
                ...(layout.reason === undefined ? {} : { reason: layout.reason }),
                bytes: layouts.reduce((total, answer) => total + answer.bytes, 0)
              })
        },
        ...counts,
        ...(prefixCache === undefined ? {} : { prefixCache }),
        ...(imports.length === 0
          ? {}
          : {
              kvImports: {
                requests: imports.reduce((total, answer) => total + answer.requests, 0),
                tokens: imports.reduce((total, answer) => total + answer.tokens, 0)
              }
            }),
        ...(clocks.length === 0
          ? {}
          : {
              steps: {
                count: clockSum("count"),
                seconds: clockSum("seconds"),
                decoderRuns: clockSum("decoderRuns"),
                decoderSeconds: clockSum("decoderSeconds")
              }
            })
      }
    }

    const accept = (id: string, meta: LlmRequestMeta, trace: string | undefined, share: Share | undefined) => {
      const received = performance.now()
      switch (meta.op) {
        case "stats": {
          requests.set(id, { op: "stats", answers: new Map(), trace, received })
          for (const queue of statsQueues) queue.push(id)
          return wakeup.wakeAll()
        }
        case "kv-import": {
          if (requests.size >= config.maxQueuedRequests)
            return void sendRouter(
              failedMessage(id, new EngineUnavailable({ message: "the executor's queue is full" }))
            )
          requests.set(id, { op: "kv-import", meta, answers: new Map(), trace, received })
          for (const queue of statsQueues) queue.push(id)
          return wakeup.wakeAll()
        }
        case "kv-export":
        case "embed": {
          if (requests.size >= config.maxQueuedRequests)
            return void sendRouter(
              failedMessage(id, new EngineUnavailable({ message: "the executor's queue is full" }))
            )
          requests.set(id, { op: "embed", meta, trace, received })
          embedQueue.push(id)
          return wakeup.wakeAll()
        }
        case "generate": {
          const positions = cachePositions(meta.prompt, meta.sampling)
          const admission = scheduler.enqueue(id, positions, share)
          if (admission._tag === "QueueFull")
            return void sendRouter(
              failedMessage(id, new EngineUnavailable({ message: "the executor's queue is full" }))
            )
          if (admission._tag === "TooLarge") {
            const message =
              `the request needs ${admission.neededBytes} bytes of KV cache (${positions} positions of prompt and max_tokens, ` +
              `${budget.bytesPerPosition} bytes each, in blocks of ${budget.blockTokens}); the executor's KV cache budget is ` +
              `${budget.totalBytes} bytes a device, ${admission.budgetBytes} of them for running requests (the rest for the prefix cache)`
            return void sendRouter(failedMessage(id, new EngineRejected({ message })))
          }
          requests.set(id, { op: "generate", meta, generated: 0, trace, received })
          return wakeup.wakeAll()
        }
      }
    }

    const cancel = (id: string) => {
      const request = requests.get(id)
      if (request === undefined) return
      requests.delete(id)
      counts.cancelled++
      if (request.op === "embed") {
        const queued = embedQueue.indexOf(id)
        if (queued >= 0) embedQueue.splice(queued, 1)
        return
      }
      const placement = scheduler.release(id)
      if (placement?._tag === "Running") frees[placement.lane]!.add(id)
      wakeup.wakeAll()
    }

    /** The next step of `lane`: frees, queued embeddings, the running batch, and the requests that join it now. */
    const planStep = (lane: number): Array<BatchItem> => {
      const item = (requestId: string, op: StepOp): BatchItem => ({ requestId, index: 0, meta: op, rows: [0, 0] })
      /** A request's first step: its wait in the queue ends, and the worker's span of it begins. */
      const firstItem = (requestId: string, request: OpenRequest, op: StepOp): BatchItem => {
        startSpan("queue", { parent: request.trace, startTime: request.received }).end()
        return request.trace === undefined ? item(requestId, op) : { ...item(requestId, op), trace: request.trace }
      }
      const items = [...frees[lane]!].map((id) => item(id, { op: "free" }))
      frees[lane]!.clear()
      for (const id of statsQueues[lane]!.splice(0)) {
        const request = requests.get(id)
        if (request?.op === "stats") items.push(item(id, { op: "stats" }))
        else if (request?.op === "kv-import") items.push(item(id, request.meta))
      }
      for (const id of embedQueue.splice(0, config.maxBatchSize)) {
        const request = requests.get(id)
        if (request?.op === "embed") items.push(firstItem(id, request, request.meta))
      }
      for (const id of scheduler.running(lane)) items.push(item(id, { op: "decode" }))
      for (const id of scheduler.admit(lane)) {
        const request = requests.get(id)
        if (request?.op === "generate")
          items.push(
            firstItem(id, request, {
              op: "prefill",
              prompt: request.meta.prompt,
              sampling: request.meta.sampling,
              ...(request.meta.kv === undefined ? {} : { kv: request.meta.kv }),
              ...(request.meta.states === undefined ? {} : { states: request.meta.states }),
              ...(request.meta.trailing === undefined ? {} : { trailing: request.meta.trailing })
            })
          )
      }
      counts.largestBatch = Math.max(counts.largestBatch, scheduler.running(lane).length)
      return items
    }

    const runStep = (lane: number, items: ReadonlyArray<BatchItem>) =>
      new Promise<void>((resolve) => {
        const step = nextStep++
        steps.set(step, {
          lane,
          items,
          done: () => {
            steps.delete(step)
            resolve()
          }
        })
        const message: ToWorker = { t: "batch", batch: step, inputs: {}, items, shard: [0, items.length] }
        workers.send(lane, message)
      })

    /**
     * A lane keeps its next step queued at the worker while the current one runs, so the worker
     * goes from step to step without waiting for the engine. A step planned before the previous
     * one ended may name requests that ended in it: the worker skips those.
     */
    const runLane = async (lane: number, stop: AbortSignal) => {
      stop.addEventListener("abort", () => wakeup.wakeAll(), { once: true })
      const outstanding: Array<Promise<void>> = []
      while (workers.healthy && !stop.aborted) {
        if (outstanding.length >= stepsAhead) {
          await outstanding.shift()
          continue
        }
        const items = planStep(lane)
        if (items.length > 0) outstanding.push(runStep(lane, items))
        else if (outstanding.length > 0) await outstanding.shift()
        else await wakeup.wait()
      }
    }

    const onToken = (id: string, partial: TokenPartial) => {
      const request = requests.get(id)
      if (request?.op !== "generate") return
      request.generated++
      void sendRouter({ t: "partial", id, item: 0, value: partial })
      if (partial.finish !== undefined)
        finish(id, { finishReason: partial.finish, completionTokens: request.generated })
    }

    const onStepDone = (step: RunningStep, results: ReadonlyArray<unknown>) => {
      step.items.forEach((item, index) => {
        const request = requests.get(item.requestId)
        if (request?.op === "stats") {
          request.answers.set(step.lane, (results[index] ?? {}) as WorkerStats)
          if (request.answers.size < config.devices.length) return
          requests.delete(item.requestId)
          return void sendRouter({ t: "result", id: item.requestId, results: [stats(request.answers.values())] })
        }
        if (request?.op === "kv-import") {
          request.answers.set(step.lane, (results[index] ?? {}) as KvResult)
          if (request.answers.size < config.devices.length) return
          requests.delete(item.requestId)
          const answers = [...request.answers.values()]
          const refused = answers.find((answer) => answer.error !== undefined)?.error
          return void sendRouter(
            refused === undefined
              ? { t: "result", id: item.requestId, results: [answers[0]!] }
              : failedMessage(item.requestId, new EngineRejected({ message: refused }))
          )
        }
        if (request?.op !== "embed") return
        const result = results[index] as EmbedResult | KvResult
        requests.delete(item.requestId)
        if (result.error !== undefined)
          void sendRouter(failedMessage(item.requestId, new EngineRejected({ message: result.error })))
        else void sendRouter({ t: "result", id: item.requestId, results: [result] })
      })
      step.done()
    }

    const workers = yield* startWorkerGroup({
      config,
      sockets,
      replies: {
        partial: (step, item, value) => {
          const batchItem = steps.get(step)?.items[item]
          if (batchItem !== undefined) onToken(batchItem.requestId, value as TokenPartial)
        },
        done: (step, _rank, results) => {
          const running = steps.get(step)
          if (running !== undefined) onStepDone(running, results)
        },
        failed: (step, _rank, error) => {
          const running = steps.get(step)
          if (running === undefined) return
          // A step's failure fails its requests for good: the dispatcher's failover carries a broken stream on.
          for (const item of running.items) fail(item.requestId, new ExecutorFailed({ message: error.message }))
          running.done()
        },
        lost: (reason) => {
          for (const id of [...requests.keys()])
            fail(id, new EngineUnavailable({ message: `the executor failed: ${reason}` }))
          for (const step of steps.values()) step.done()
          wakeup.wakeAll()
        }
      }
    })

    const receiveRequests = async (stop: AbortSignal) => {
      for await (const message of messagesOf<ToEngine<LlmRequestMeta>>(fromRouter)) {
        if (stop.aborted) return
        if (message.t === "worker-lost") workers.lose(message.reason)
        else if (message.t === "cancel") cancel(message.id)
        else if (!workers.healthy)
          void sendRouter(failedMessage(message.id, new EngineUnavailable({ message: "the executor is unhealthy" })))
        else {
          const item = message.items[0]!
          accept(message.id, item.meta, item.trace, item.share)
        }
      }
    }

    return yield* runEngineLoops([
      receiveRequests,
      ...config.devices.map((_, lane) => (stop: AbortSignal) => runLane(lane, stop))
    ])
  })
