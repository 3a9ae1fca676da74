import { CodecDecoderConfig } from "../../app-runtime/tasks/CodecDecoderTask.js"
import { randomUUID } from "node:crypto"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { EncoderConfig } from "../../app-runtime/tasks/EncoderTask.js"
import { GeneratorConfig } from "../../app-runtime/tasks/GeneratorTask.js"
import type { TaskInvocationWire } from "../../app-runtime/tasks/TaskGraph.js"
import { NodeAgent } from "../../node/NodeAgent.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { eitherSignal } from "../executor-calls/EitherSignal.js"
import { type CallContext, executorCalls } from "../executor-calls/ExecutorCalls.js"
import {
  BadRequest,
  DispatchFailed,
  RecordingInProgress,
  TaskInputRejected,
  TaskNotFound,
  TaskUnavailable
} from "../errors.js"
import { saidWhere } from "../RemoteError.js"
import type { LevelMeasured, RecordedProfile, RecordRequest } from "./ProfileRecording.js"
import { type ExecutorLease, type TaskManager, TaskManagers, TaskQueueBound } from "./TaskManagers.js"
import { codecModel, generatorModel, prompts, syntheticMedia } from "./SyntheticInputs.js"
import { TaskProfile } from "./TaskProfile.js"

export type RecordingError = TaskUnavailable | TaskInputRejected | DispatchFailed

/** How a recording ended: its profile, and whether the state dir keeps it (else why not). */
export interface RecordingOutcome {
  readonly profile: RecordedProfile
  readonly notKept: string | undefined
}

/** One synthetic call on a leased executor: resolves with the milliseconds it took once its answer (or stream) ended. */
type SyntheticCall = (lease: ExecutorLease, signal: AbortSignal) => Promise<number>

/** A worker that could not lease, or whose call failed, waits this long before it tries again. */
const retryPauseMs = 100
/** How long an encoder's output may take to be in this node's sidecar, to be taken out, once the encoder answered. */
const discardWaitMs = 3_000

/** Nearest-rank median of sorted values (NaN of none). */
const median = (sorted: ReadonlyArray<number>) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.max(0, Math.ceil(0.5 * sorted.length) - 1)]!

const round = (value: number) => (Number.isFinite(value) ? Number(value.toFixed(2)) : value)

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const freshId = () => `profile-${randomUUID().replaceAll("-", "")}`

const invocation = (spec: UnitTaskSpec, operation: string, input: unknown, output: unknown): TaskInvocationWire => ({
  taskId: spec.id,
  kind: spec.kind,
  operation,
  config: spec.config,
  input,
  output,
  streams: false
})

const drain = async (stream: AsyncIterable<unknown> | undefined) => {
  if (stream === undefined) return
  for await (const _ of stream);
}

/** An executor's error as one the recording answers with (anything unexpected is the executor's failure). */
const recordingError = (error: unknown): RecordingError =>
  error instanceof TaskUnavailable || error instanceof TaskInputRejected || error instanceof DispatchFailed
    ? error
    : new DispatchFailed({ message: error instanceof Error ? error.message : String(error) })

/**
 * Records a task's profile ahead of time: a closed-loop load sweep against its executors. At each
 * load level L, L synthetic calls are kept in flight for the level's seconds, each a real call to
 * an executor the task's manager leases (as the dispatcher's calls are), with an input of the
 * task's kind; their latencies, by level and executor count, make a fresh TaskProfile. The summary
 * becomes the task's recorded profile and is kept in the state dir.
 *
 * - LLM: short chat prompts, a few tokens each.
 * - Encoder: a small generated image, audio clip or video (an animated GIF) of its modality, as a
 *   `data:` URL; its embedding is sent to this node's sidecar and taken out of it there.
 * - Text embedder: one short sentence, its vector answered inline.
 * - Speech recognizer: a short generated clip, its transcript answered inline.
 * - Generator: prompt embeddings of the shape its model takes ([rows, hidden] float32, hidden from
 *   its config.json's `prompt_embeddings`), put into its node's sidecar from this node's.
 */
export class ProfileRecorder extends Effect.Service<ProfileRecorder>()("cornserve/ProfileRecorder", {
  scoped: Effect.gen(function* () {
    const taskManagers = yield* TaskManagers
    const agent = yield* NodeAgent
    const queueBound = yield* TaskQueueBound
    const config = yield* ServeConfig
    const scope = yield* Effect.scope
    /** Tasks whose profile is being recorded. */
    const recording = new Set<string>()

    /** Takes a profile's call's data (an encoder's output, a generator's input) out of this node's sidecar. */
    const discard = async (id: string) => (await agent.sidecarClient()).drop(id, discardWaitMs)

    /** The synthetic call of the task's kind, with its input made once; BadRequest when the kind cannot be recorded. */
    const syntheticCall = (spec: UnitTaskSpec): Effect.Effect<SyntheticCall, BadRequest> =>
      Effect.gen(function* () {
        /** The task's config, read as its kind writes it. */
        const configOf = <A, I>(schema: Schema.Schema<A, I>) =>
          Schema.decodeUnknown(schema)(spec.config).pipe(
            Effect.mapError(
              () =>
                new BadRequest({ message: `task ${spec.id} cannot be recorded: its config is not a ${spec.kind}'s` })
            )
          )
        const context = (signal: AbortSignal, receivers: ReadonlyArray<string>): CallContext => ({
          receivers,
          modalities: new Map(),
          signal,
          credential: config.internalSecret
        })
        switch (spec.kind) {
          case "llm": {
            let next = 0
            return async (lease, signal) => {
              const input = { messages: [{ role: "user", content: prompts[next++ % prompts.length] }], max_tokens: 8 }
              const began = performance.now()
              const result = await executorCalls.chat!(
                lease.url,
                invocation(spec, "chat", input, {}),
                context(signal, [])
              )
              await drain(result.stream)
              return performance.now() - began
            }
          }
          case "encoder": {
            const { modality } = yield* configOf(EncoderConfig)
            const url = yield* Effect.promise(() => syntheticMedia(modality))
            return async (lease, signal) => {
              const id = freshId()
              const began = performance.now()
              try {
                await executorCalls.embed!(
                  lease.url,
                  invocation(spec, "embed", { urls: [url] }, { embeddings: [{ $dataForward: id }] }),
                  context(signal, [agent.nodeId])
                )
              } catch (error) {
                void discard(id).catch(() => undefined)
                throw error
              }
              const tookMs = performance.now() - began
              await discard(id).catch(() => undefined)
              return tookMs
            }
          }
          case "text-embedder": {
            let next = 0
            return async (lease, signal) => {
              const input = { input: prompts[next++ % prompts.length] }
              const began = performance.now()
              await executorCalls["embed-text"]!(
                lease.url,
                invocation(spec, "embed-text", input, {}),
                context(signal, [])
              )
              return performance.now() - began
            }
          }
          case "speech-recognizer": {
            const file = yield* Effect.promise(() => syntheticMedia("audio"))
            return async (lease, signal) => {
              const began = performance.now()
              await executorCalls.transcribe!(
                lease.url,
                invocation(spec, "transcribe", { file }, {}),
                context(signal, [])
              )
              return performance.now() - began
            }
          }
          case "speech-synthesizer": {
            return async (lease, signal) => {
              const began = performance.now()
              const call = await executorCalls.synthesize!(
                lease.url,
                invocation(spec, "synthesize", { input: "The quick brown fox jumps over the lazy dog." }, {}),
                context(signal, [])
              )
              for await (const _ of call.stream!) {
                // Spoken to the end: the profile is the whole utterance's time.
              }
              return performance.now() - began
            }
          }
          case "codec-decoder": {
            const codec = yield* configOf(CodecDecoderConfig)
            const model = yield* Effect.promise(() => codecModel(codec.model))
            if (typeof model === "string")
              return yield* new BadRequest({ message: `task ${spec.id} (${spec.kind}) cannot be recorded: ${model}` })
            // 10 s of codes at 12.5 frames a second, every codebook the model has.
            const codes = Array.from({ length: model.quantizers }, (_, q) =>
              Array.from({ length: 125 }, (_, t) => (t * 31 + q * 7) % model.codebookSize)
            )
            return async (lease, signal) => {
              const began = performance.now()
              const call = await executorCalls["decode-codes"]!(
                lease.url,
                invocation(spec, "decode-codes", { codes }, {}),
                context(signal, [])
              )
              await drain(call.stream)
              return performance.now() - began
            }
          }
          case "image-generator":
          case "audio-generator": {
            const generator = yield* configOf(GeneratorConfig)
            const model = yield* Effect.promise(() => generatorModel(generator.model))
            if (typeof model === "string")
              return yield* new BadRequest({ message: `task ${spec.id} (${spec.kind}) cannot be recorded: ${model}` })
            const rows = 8
            const embeddings = new Tensor(
              "float32",
              [rows, model.hidden],
              Float32Array.from({ length: rows * model.hidden }, (_, index) => Math.sin(index) / 4)
            )
            const operation = spec.kind === "image-generator" ? "generate-image" : "generate-audio"
            const size = model.image ?? { width: 64, height: 64 }
            return async (lease, signal) => {
              const id = freshId()
              const client = await agent.sidecarClient()
              await client.send(id, embeddings, { to: [lease.node] })
              const input =
                operation === "generate-image"
                  ? { embeddings: { $dataForward: id }, width: size.width, height: size.height }
                  : { embeddings: { $dataForward: id } }
              const began = performance.now()
              try {
                const result = await executorCalls[operation]!(
                  lease.url,
                  invocation(spec, operation, input, {}),
                  context(signal, [lease.node])
                )
                await drain(result.stream)
              } catch (error) {
                // Embeddings the executor never took are taken back here; on another node, its
                // sidecar's time limit reclaims them.
                if (lease.node === agent.nodeId) void discard(id).catch(() => undefined)
                throw error
              }
              return performance.now() - began
            }
          }
          default:
            return yield* new BadRequest({
              message: `task ${spec.id} cannot be recorded: no synthetic input is known for its kind (${spec.kind})`
            })
        }
      })

    /**
     * `level` workers, each making calls one after another until the level's time is up; every call
     * is measured into `profile`. An input the executor rejects fails at once (every call would);
     * other failures are counted and the worker goes on after a pause.
     */
    const runLevel = async (
      task: TaskManager,
      call: SyntheticCall,
      level: number,
      seconds: number,
      profile: TaskProfile,
      signal: AbortSignal
    ): Promise<LevelMeasured> => {
      const began = performance.now()
      const deadline = began + seconds * 1000
      const stop = new AbortController()
      const stopped = eitherSignal(signal, stop.signal)
      const latencies: Array<number> = []
      let failed = 0
      let lastFailure: unknown
      const worker = async () => {
        while (performance.now() < deadline && !stopped.signal.aborted) {
          let lease: ExecutorLease
          try {
            lease = await task.lease({ signal: stopped.signal, synthetic: true })
          } catch (error) {
            if (stopped.signal.aborted || task.state === "tearing-down") throw error
            // The task is full (its own calls besides these), or has no healthy executor for now.
            lastFailure = error
            await sleep(retryPauseMs)
            continue
          }
          const executors = task.executors().length
          const callSignal = eitherSignal(stopped.signal, lease.signal)
          // Each call is measured at the load it met, as the online profile measures calls: the
          // task's calls in flight, this recording's (fewer than `level` while leases are refused
          // and retried) and any the task's apps make meanwhile.
          const load = lease.level
          try {
            const latencyMs = await call(lease, callSignal.signal)
            lease.release("ok")
            latencies.push(latencyMs)
            profile.record({ endedAt: Date.now(), latencyMs, level: load, executors, ok: true })
          } catch (error) {
            const unavailable = error instanceof TaskUnavailable && !stopped.signal.aborted
            lease.release(unavailable ? "unavailable" : "failed")
            if (stopped.signal.aborted || error instanceof TaskInputRejected) throw error
            failed++
            lastFailure = error
            profile.record({ endedAt: Date.now(), latencyMs: 0, level: load, executors, ok: false })
            await sleep(retryPauseMs)
          } finally {
            callSignal.dispose()
          }
        }
      }
      try {
        await Promise.all(
          Array.from({ length: level }, () =>
            worker().catch((error: unknown) => {
              stop.abort()
              throw error
            })
          )
        )
      } finally {
        stopped.dispose()
      }
      if (latencies.length === 0)
        throw saidWhere(recordingError(lastFailure ?? new Error("no call was made")), "no call succeeded")
      const elapsed = (performance.now() - began) / 1000
      return {
        level,
        executors: task.executors().length,
        seconds: round(elapsed),
        calls: latencies.length + failed,
        failed,
        p50Ms: round(median(latencies.sort((a, b) => a - b))),
        callsPerSecond: round(latencies.length / elapsed)
      }
    }

    const sweep = (
      task: TaskManager,
      call: SyntheticCall,
      request: RecordRequest,
      onLevel: (measured: LevelMeasured) => void
    ) =>
      Effect.gen(function* () {
        // A recording's calls count for good: its levels are measured one after another.
        const profile = new TaskProfile(Date.now(), Number.POSITIVE_INFINITY)
        for (const level of request.levels) {
          const measured = yield* Effect.tryPromise({
            try: (signal) => runLevel(task, call, level, request.secondsPerLevel, profile, signal),
            catch: (error) => saidWhere(recordingError(error), `recording task ${task.spec.id} at load ${level}`)
          })
          onLevel(measured)
        }
        const recorded: RecordedProfile = {
          ...profile.summary(Date.now()),
          recordedAt: new Date().toISOString(),
          levels: request.levels,
          secondsPerLevel: request.secondsPerLevel
        }
        const notKept = yield* taskManagers.keepRecorded(task.spec.id, recorded).pipe(
          Effect.as(undefined),
          Effect.catchAll((error) =>
            Effect.as(
              Effect.logWarning(`the recorded profile of task ${task.spec.id} is not kept: ${error.message}`),
              error.message
            )
          )
        )
        return { profile: recorded, notKept } satisfies RecordingOutcome
      })

    /**
     * Starts recording the task's profile: fails at once when the task is not deployed (or not
     * ready), is being recorded already, or asks more calls in flight than it takes; else answers the
     * running recording, told of each level as it ends. It ends with the platform, or when interrupted.
     */
    const record = Effect.fn("ProfileRecorder.record")(function* (
      taskId: string,
      request: RecordRequest,
      onLevel: (measured: LevelMeasured) => void
    ) {
      const task = taskManagers.get(taskId)
      if (task === undefined) return yield* new TaskNotFound({ taskId })
      if (recording.has(taskId)) return yield* new RecordingInProgress({ taskId })
      if (task.state !== "ready") return yield* new TaskUnavailable({ message: `task ${taskId} is ${task.state}` })
      const inRotation = task.executors().filter((executor) => executor.healthy).length
      const limit = queueBound * Math.max(1, inRotation)
      const highest = Math.max(...request.levels)
      if (highest > limit) {
        return yield* new BadRequest({
          message: `load ${highest} is more than task ${taskId} takes: ${limit} call(s) in flight (${queueBound} per executor in rotation, serve --task-queue)`
        })
      }
      recording.add(taskId)
      return yield* syntheticCall(task.spec).pipe(
        Effect.flatMap((call) =>
          sweep(task, call, request, onLevel).pipe(
            Effect.ensuring(Effect.sync(() => recording.delete(taskId))),
            Effect.forkIn(scope)
          )
        ),
        Effect.onError(() => Effect.sync(() => recording.delete(taskId)))
      )
    })

    return {
      record,
      /** The task's recorded profile, with when and how it was recorded; undefined when none was. */
      recorded: (taskId: string): RecordedProfile | undefined => taskManagers.recordedProfile(taskId)
    }
  }),
  dependencies: [TaskManagers.Default, NodeAgent.Default]
}) {}
