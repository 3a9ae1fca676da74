import { type ResourceLimits, Worker } from "node:worker_threads"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import { EngineUnavailable, ExecutorFailed } from "./errors.js"
import { MediaFailure } from "./media/errors.js"
import { abortReason } from "./ThreadJob.js"

const workerEntry = new URL("./ThreadPoolWorker.js", import.meta.url)

/** What the router asks a thread: run a job, or stop one whose request ended. */
export type ThreadRequest =
  | { readonly type: "run"; readonly id: number; readonly task: string; readonly input: unknown }
  | { readonly type: "cancel"; readonly id: number }

/**
 * A thread's answer to a job. A media failure travels as its Schema, so the caller gets the same
 * class the preprocessing threw; any other error arrives as a plain Error with its name and message.
 */
export type ThreadReply =
  | { readonly id: number; readonly ok: true; readonly value: unknown }
  | { readonly id: number; readonly ok: false; readonly mediaFailure: typeof MediaFailure.Encoded }
  | { readonly id: number; readonly ok: false; readonly error: { readonly name: string; readonly message: string } }

/** What each thread is started with. */
export interface ThreadData {
  readonly moduleUrl: string
  readonly scratchDir: string | undefined
}

const decodeMediaFailure = Schema.decodeUnknownSync(MediaFailure)

/**
 * More thread deaths than `deaths` within `windowMs` and the pool cannot work: its router reports
 * itself unhealthy (and is restarted), and no thread is started until the deaths leave the window.
 */
export const threadDeathBound = { deaths: 5, windowMs: 60_000 } as const

export interface ThreadPoolOptions {
  /** The module whose exported functions the threads run. */
  readonly moduleUrl: string
  /** The most threads; each starts when a job finds every running one busy. */
  readonly size: number
  /** Where jobs keep their temporary files (see ThreadJob.ts); by default the system's directory. */
  readonly scratchDir?: string
  /** Heap bounds of each thread, past which it dies (and is replaced). */
  readonly resourceLimits?: ResourceLimits
  /** One thread started with the pool, for a caller whose every job would otherwise wait for the first. */
  readonly startOne?: boolean
}

interface Job {
  readonly resolve: (value: unknown) => void
  readonly reject: (error: Error) => void
}

/** One thread and the jobs it was given; between a thread's death and its replacement, none. */
interface Slot {
  thread: Worker | undefined
  readonly jobs: Map<number, Job>
}

/**
 * Worker threads that run the functions a module exports (an executor's preprocessing: decoding
 * and resizing media), so that the router's event loop stays free. Jobs go to the thread with the
 * fewest jobs; typed arrays in results are moved, not copied. A job ends early when its signal
 * aborts (its request ended): the thread is told, and stops what it started for it. A thread that
 * dies (exits, throws, runs out of heap) fails its jobs with its reason and is replaced.
 *
 * Threads start on demand: one when a job finds every running thread busy, up to `size` (and one
 * with the pool where `startOne` says so). A thread is an isolate with the preprocessing module
 * loaded (tens of MiB), and an executor that is never sent media, or one request at a time, needs
 * none or one.
 */
export class ThreadPool {
  private readonly slots: ReadonlyArray<Slot>
  private readonly deaths: Array<{ readonly at: number; readonly reason: string }> = []
  private nextId = 0
  private closing = false

  private constructor(private readonly options: ThreadPoolOptions) {
    this.slots = Array.from({ length: options.size }, () => ({ thread: undefined, jobs: new Map() }))
  }

  static make(options: ThreadPoolOptions): Effect.Effect<ThreadPool, never, Scope.Scope> {
    return Effect.acquireRelease(
      Effect.sync(() => {
        const pool = new ThreadPool(options)
        if (options.startOne === true && pool.slots[0] !== undefined) pool.start(pool.slots[0])
        return pool
      }),
      (pool) => Effect.promise(() => pool.close())
    )
  }

  /**
   * Why the pool cannot work, or undefined while it can: its threads died more often than
   * `threadDeathBound` allows.
   */
  get failure(): string | undefined {
    const since = Date.now() - threadDeathBound.windowMs
    while (this.deaths.length > 0 && this.deaths[0]!.at < since) this.deaths.shift()
    if (this.deaths.length <= threadDeathBound.deaths) return undefined
    return `preprocessing threads died ${this.deaths.length} times in ${threadDeathBound.windowMs / 1000} s; the last: ${this.deaths.at(-1)!.reason}`
  }

  run<T>(task: string, input: unknown, options: { readonly signal?: AbortSignal | undefined } = {}): Promise<T> {
    const { signal } = options
    if (signal?.aborted) return Promise.reject(abortReason(signal))
    const slot = this.slotFor()
    if (slot === undefined) {
      return Promise.reject(
        new EngineUnavailable({
          message: `no preprocessing thread is running: ${this.failure ?? "the pool is closing"}`
        })
      )
    }
    const thread = slot.thread!
    const id = this.nextId++
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => {
        if (!slot.jobs.delete(id)) return
        thread.postMessage({ type: "cancel", id } satisfies ThreadRequest)
        reject(abortReason(signal!))
      }
      const stopListening = () => signal?.removeEventListener("abort", onAbort)
      slot.jobs.set(id, {
        resolve: (value) => {
          stopListening()
          resolve(value as T)
        },
        reject: (error) => {
          stopListening()
          reject(error)
        }
      })
      signal?.addEventListener("abort", onAbort, { once: true })
      thread.postMessage({ type: "run", id, task, input } satisfies ThreadRequest)
    })
  }

  /** The running thread with the fewest jobs, or a new one when every running thread is busy. */
  private slotFor(): Slot | undefined {
    let best: Slot | undefined
    for (const slot of this.slots) {
      if (slot.thread !== undefined && (best === undefined || slot.jobs.size < best.jobs.size)) best = slot
    }
    if (best !== undefined && best.jobs.size === 0) return best
    const idle = this.slots.find((slot) => slot.thread === undefined)
    if (idle === undefined || this.closing || this.failure !== undefined) return best
    this.start(idle)
    return idle
  }

  private start(slot: Slot): void {
    const thread = new Worker(workerEntry, {
      workerData: { moduleUrl: this.options.moduleUrl, scratchDir: this.options.scratchDir } satisfies ThreadData,
      ...(this.options.resourceLimits === undefined ? {} : { resourceLimits: this.options.resourceLimits })
    })
    let error: Error | undefined
    thread.on("message", (reply: ThreadReply) => {
      const job = slot.jobs.get(reply.id)
      if (job === undefined) return
      slot.jobs.delete(reply.id)
      if (reply.ok) job.resolve(reply.value)
      else if ("mediaFailure" in reply) job.reject(decodeMediaFailure(reply.mediaFailure))
      else job.reject(Object.assign(new Error(reply.error.message), { name: reply.error.name }))
    })
    thread.on("error", (thrown) => {
      error ??= thrown
    })
    thread.once("exit", (code) => this.died(slot, thread, error?.message ?? `it exited with code ${code}`))
    slot.thread = thread
  }

  /** A thread is gone: its jobs fail with its reason; the next job that needs a thread starts one. */
  private died(slot: Slot, thread: Worker, reason: string): void {
    if (slot.thread !== thread) return
    slot.thread = undefined
    const failed = new ExecutorFailed({ message: `the preprocessing thread died: ${reason}` })
    const jobs = [...slot.jobs.values()]
    slot.jobs.clear()
    for (const job of jobs) job.reject(failed)
    if (!this.closing) this.deaths.push({ at: Date.now(), reason })
  }

  private async close(): Promise<void> {
    this.closing = true
    await Promise.all(this.slots.map((slot) => slot.thread?.terminate()))
  }
}

/**
 * Runs `work` for each item with one signal, which aborts when `signal` does or when one of them
 * fails: a request's jobs end with it, and once one fails, the others' answer no longer matters.
 */
export const allOrNone = async <A, B>(
  items: ReadonlyArray<A>,
  signal: AbortSignal | undefined,
  work: (item: A, signal: AbortSignal) => Promise<B>
): Promise<Array<B>> => {
  const together = new AbortController()
  const abort = () => together.abort(signal?.reason)
  if (signal?.aborted) abort()
  else signal?.addEventListener("abort", abort, { once: true })
  try {
    return await Promise.all(
      items.map((item) =>
        work(item, together.signal).catch((error: unknown) => {
          together.abort(error)
          throw error
        })
      )
    )
  } finally {
    signal?.removeEventListener("abort", abort)
  }
}
